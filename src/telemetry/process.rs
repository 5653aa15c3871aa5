//! CPU time and memory of a process, read from /proc (Linux): how the load generator
//! (loadgen/) and the end-to-end tier measure the server.

use std::path::PathBuf;

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcSample {
    /// User + system CPU seconds over all threads.
    pub cpu_seconds: f64,
    /// The system (kernel) part of it.
    pub system_seconds: f64,
    /// Resident set now, and its peak (VmHWM), in bytes.
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// On-CPU seconds of the live threads, to the nanosecond (the sum of
    /// /proc/PID/task/*/schedstat), when the kernel keeps them.
    pub on_cpu_seconds: Option<f64>,
}

impl ProcSample {
    /// CPU milliseconds from `before` to this reading. The nanosecond counts when both
    /// readings have them: a loop over a small fleet takes a few ms of CPU, less than
    /// the 10 ms tick utime and stime are counted in. Else the ticks. (A thread that
    /// ended between the readings takes its nanoseconds with it; the server's tokio
    /// workers live as long as the process.)
    pub fn cpu_ms_since(&self, before: &ProcSample) -> f64 {
        match (before.on_cpu_seconds, self.on_cpu_seconds) {
            (Some(b), Some(a)) => ((a - b) * 1000.0).max(0.0),
            _ => (self.cpu_seconds - before.cpu_seconds) * 1000.0,
        }
    }
}

pub struct ProcWatch {
    dir: PathBuf,
    ticks_per_second: f64,
}

impl ProcWatch {
    pub fn new(pid: u32) -> Self {
        Self {
            dir: PathBuf::from(format!("/proc/{pid}")),
            // USER_HZ is 100 on every Linux architecture this runs on.
            ticks_per_second: 100.0,
        }
    }

    /// One thread of this process (`/proc/self/task/TID`): its own CPU times.
    pub fn thread(tid: u32) -> Self {
        Self {
            dir: PathBuf::from(format!("/proc/self/task/{tid}")),
            ..Self::new(0)
        }
    }

    pub fn sample(&self) -> std::io::Result<ProcSample> {
        let stat = std::fs::read_to_string(self.dir.join("stat"))?;
        let status = std::fs::read_to_string(self.dir.join("status"))?;
        let mut s = parse(&stat, &status, self.ticks_per_second).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unexpected format in {}", self.dir.display()),
            )
        })?;
        s.on_cpu_seconds = self.on_cpu_seconds();
        Ok(s)
    }

    /// The sum of the threads' on-CPU nanoseconds, in seconds (None when the kernel
    /// has no schedstat).
    fn on_cpu_seconds(&self) -> Option<f64> {
        let mut ns: u64 = 0;
        for task in std::fs::read_dir(self.dir.join("task")).ok()? {
            // A thread that ended since the listing has nothing left to count.
            let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
                continue;
            };
            ns += parse_schedstat(&text)?;
        }
        Some(ns as f64 / 1e9)
    }
}

/// Parses /proc/PID/stat (utime, stime: fields 14 and 15) and /proc/PID/status
/// (VmRSS, VmHWM in kB).
pub fn parse(stat: &str, status: &str, ticks_per_second: f64) -> Option<ProcSample> {
    // The command name (field 2) may hold spaces; fields restart after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state), so field N is rest[N - 3].
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let kb = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(ProcSample {
        cpu_seconds: (utime + stime) / ticks_per_second,
        system_seconds: stime / ticks_per_second,
        rss_bytes: kb("VmRSS:")? * 1024,
        peak_rss_bytes: kb("VmHWM:")? * 1024,
        on_cpu_seconds: None,
    })
}

/// The on-CPU nanoseconds in a /proc/PID/task/TID/schedstat (its first field).
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_and_status() {
        let stat =
            "4242 (ca asg (x)) S 1 4242 4242 0 -1 4194560 2345 0 0 0 150 25 0 0 20 0 9 0 123 0 0";
        let status = "Name:\tx\nVmHWM:\t   61440 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n";
        let s = parse(stat, status, 100.0).unwrap();
        assert_eq!(s.cpu_seconds, 1.75);
        assert_eq!(s.system_seconds, 0.25);
        assert_eq!(s.rss_bytes, 40 * 1024 * 1024);
        assert_eq!(s.peak_rss_bytes, 60 * 1024 * 1024);
        assert!(parse("garbage", status, 100.0).is_none());
        assert!(parse(stat, "Name: x\n", 100.0).is_none());
    }

    #[test]
    fn reads_this_process() {
        let s = ProcWatch::new(std::process::id()).sample().unwrap();
        assert!(s.rss_bytes > 0 && s.peak_rss_bytes >= s.rss_bytes);
        assert!(s.on_cpu_seconds.is_none_or(|c| c > 0.0), "{s:?}");
    }

    #[test]
    fn cpu_counts_nanoseconds_when_both_readings_have_them() {
        assert_eq!(parse_schedstat("92353116 49861374 248\n"), Some(92_353_116));
        assert_eq!(parse_schedstat(""), None);
        let before = ProcSample {
            cpu_seconds: 1.0,
            on_cpu_seconds: Some(1.002),
            ..ProcSample::default()
        };
        let after = ProcSample {
            cpu_seconds: 1.0,
            on_cpu_seconds: Some(1.0055),
            ..ProcSample::default()
        };
        assert!((after.cpu_ms_since(&before) - 3.5).abs() < 1e-9);
        let ticks_only = ProcSample {
            cpu_seconds: 1.01,
            ..ProcSample::default()
        };
        assert!((ticks_only.cpu_ms_since(&before) - 10.0).abs() < 1e-9);
    }
}
