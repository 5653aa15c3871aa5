//! The resolvers of [`super::resolve`], one room per section of the file: each takes
//! its section as written (and the flags that override it), returns the section's
//! resolved value, and adds what is wrong to the one list of problems, naming the key
//! and the value. A bad value still resolves (to the default), so every later
//! section is checked too.

use std::time::Duration;

use crate::duration::parse_duration;

use super::Problem;

pub mod aws;
pub mod budgets;
pub mod group_overrides;
pub mod groups;
pub mod interruption;
pub mod listen;
pub mod scale_in;
pub mod templates;
pub mod timing;

/// Every problem found, in the order the sections found them.
#[derive(Debug, Default)]
pub struct Problems(Vec<Problem>);

impl Problems {
    /// One thing wrong at `key`.
    pub fn bad(&mut self, key: &str, message: String) {
        self.0.push(Problem {
            key: key.to_string(),
            message,
        });
    }

    /// How many problems were found so far.
    pub fn count(&self) -> usize {
        self.0.len()
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.0
    }
}

/// A Go-style duration from the file or a flag, `default` when unset; one problem
/// naming the key and the value when it does not parse or lies outside the bounds.
pub fn bounded_duration(
    problems: &mut Problems,
    key: &str,
    value: Option<&String>,
    default: Duration,
    min: Duration,
    max: Option<Duration>,
) -> Duration {
    let Some(s) = value else {
        return default;
    };
    match (parse_duration(s), max) {
        (Ok(d), None) if d >= min => d,
        (Ok(d), None) => {
            problems.bad(
                key,
                format!("{s:?} ({d:?}) is shorter than the minimum {min:?}"),
            );
            default
        }
        (Ok(d), Some(max)) if d >= min && d <= max => d,
        (Ok(d), Some(max)) => {
            problems.bad(
                key,
                format!("{s:?} ({d:?}) must be between {min:?} and {max:?}"),
            );
            default
        }
        (Err(e), _) => {
            problems.bad(key, format!("{s:?}: {e}"));
            default
        }
    }
}

#[cfg(test)]
mod tests;
