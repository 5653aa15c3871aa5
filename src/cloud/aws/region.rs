//! Whether a region name is one AWS can have, before any call is made with it: a
//! typo (`eu-wset-1`) otherwise reaches the network as a host name that does not
//! resolve, and the answer is a DNS failure that names nothing.
//!
//! Our own table of AWS's public partition facts: every region is named
//! `<area>-<direction>-<number>`, where each partition has its own areas (the
//! commercial `aws`: `us`, `eu`, `ap`, ...; `aws-cn`: `cn`; `aws-us-gov`: `us-gov`;
//! the isolated `aws-iso*` partitions: `us-iso`, `us-isob`, `eu-isoe`, `us-isof`; the
//! European Sovereign Cloud: `eusc-de`) and the direction is a compass point. A new
//! region of a known area passes; a new area needs a line here.

/// The partitions and the areas their regions are named after.
pub const PARTITIONS: &[(&str, &[&str])] = &[
    (
        "aws",
        &["us", "eu", "ap", "sa", "ca", "me", "af", "il", "mx"],
    ),
    ("aws-cn", &["cn"]),
    ("aws-us-gov", &["us-gov"]),
    ("aws-iso", &["us-iso"]),
    ("aws-iso-b", &["us-isob"]),
    ("aws-iso-e", &["eu-isoe"]),
    ("aws-iso-f", &["us-isof"]),
    ("aws-eusc", &["eusc-de"]),
];

/// The compass points region names use.
pub const DIRECTIONS: &[&str] = &[
    "north",
    "south",
    "east",
    "west",
    "central",
    "northeast",
    "northwest",
    "southeast",
    "southwest",
];

/// The partition of `region` when it is named as an AWS region; else the sentence
/// that says it is not, with the nearest name of that shape. Pure.
pub fn partition_of(region: &str) -> Result<&'static str, String> {
    let (rest, number) = region.rsplit_once('-').unwrap_or((region, ""));
    let (area, direction) = rest.rsplit_once('-').unwrap_or(("", rest));
    let numbered = !number.is_empty()
        && number.len() <= 2
        && number.bytes().all(|b| b.is_ascii_digit())
        && !number.starts_with('0');
    let partition = PARTITIONS
        .iter()
        .find(|(_, areas)| areas.contains(&area))
        .map(|(p, _)| *p);
    match partition {
        Some(p) if numbered && DIRECTIONS.contains(&direction) => Ok(p),
        _ => Err(format!(
            "region {region:?} is not an AWS region (expected like {})",
            nearest(area, direction, number)
        )),
    }
}

/// A region name of the right shape close to what was given: its area and number
/// when those are right, the nearest direction.
fn nearest(area: &str, direction: &str, number: &str) -> String {
    let known_area = PARTITIONS.iter().any(|(_, a)| a.contains(&area));
    let area = if known_area { area } else { "us" };
    let direction = DIRECTIONS
        .iter()
        .min_by_key(|d| edit_distance(d, &direction.to_ascii_lowercase()))
        .copied()
        .unwrap_or("east");
    let number = if number.len() <= 2
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
        && !number.starts_with('0')
    {
        number
    } else {
        "1"
    };
    if known_area {
        format!("{area}-{direction}-{number}")
    } else {
        "us-east-1".to_string()
    }
}

/// Levenshtein distance (small strings).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 62: every partition's regions pass, typos and made-up areas do not, and
    /// the refusal names a region of the right shape.
    #[test]
    fn regions_of_every_partition_pass_and_typos_are_named() {
        for (r, p) in [
            ("us-east-1", "aws"),
            ("eu-west-2", "aws"),
            ("ap-southeast-7", "aws"),
            ("ap-northeast-3", "aws"),
            ("ca-west-1", "aws"),
            ("me-central-1", "aws"),
            ("il-central-1", "aws"),
            ("mx-central-1", "aws"),
            ("af-south-1", "aws"),
            ("sa-east-1", "aws"),
            ("cn-northwest-1", "aws-cn"),
            ("us-gov-west-1", "aws-us-gov"),
            ("us-iso-east-1", "aws-iso"),
            ("us-isob-east-1", "aws-iso-b"),
            ("eu-isoe-west-1", "aws-iso-e"),
            ("us-isof-south-1", "aws-iso-f"),
            ("eusc-de-east-1", "aws-eusc"),
        ] {
            assert_eq!(partition_of(r), Ok(p), "{r}");
        }
        for (r, like) in [
            ("eu-wset-1", "eu-west-1"),
            ("us-esat-2", "us-east-2"),
            ("us-east", "us-east-1"),
            ("us-east-01", "us-east-1"),
            ("useast1", "us-east-1"),
            ("xx-east-1", "us-east-1"),
            ("eu-west-1a", "eu-west-1"),
            ("", "us-east-1"),
            ("EU-WEST-1", "us-east-1"),
            ("us-gov-wets-1", "us-gov-west-1"),
        ] {
            let e = partition_of(r).unwrap_err();
            assert_eq!(
                e,
                format!("region {r:?} is not an AWS region (expected like {like})"),
                "{r}"
            );
        }
    }
}
