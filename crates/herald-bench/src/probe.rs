//! Measurements of the server from the outside: CPU time, peak memory and bytes written
//! from `/proc`, and an fsync probe of the disk under the data directory.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// A snapshot of a process's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessSample {
    /// User plus system CPU time, in seconds.
    pub cpu_secs: f64,
    /// Peak resident set (VmHWM), in bytes.
    pub peak_rss: u64,
    /// Current resident set, in bytes.
    pub rss: u64,
    /// Bytes this process caused to be written to storage.
    pub write_bytes: u64,
}

impl ProcessSample {
    /// Reads `/proc/{pid}`; `None` if the process is gone or unreadable.
    pub fn read(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |name: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
        let write_bytes =
            io.lines().find_map(|l| l.strip_prefix("write_bytes:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        Some(Self {
            cpu_secs: ticks as f64 / clock_ticks_per_sec(),
            peak_rss: kib("VmHWM:") * 1024,
            rss: kib("VmRSS:") * 1024,
            write_bytes,
        })
    }
}

impl ProcessSample {
    /// A process and its direct children, summed (PostgreSQL's postmaster and backends).
    /// Memory is summed too, so shared buffers are counted more than once: use it for CPU
    /// and I/O, not for RSS.
    pub fn tree(pid: u32) -> Option<Self> {
        let mut total = Self::read(pid)?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let parent = std::fs::read_to_string(format!("/proc/{child}/stat")).ok().and_then(|stat| {
                stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
            });
            if parent == Some(pid)
                && let Some(sample) = Self::read(child)
            {
                total.cpu_secs += sample.cpu_secs;
                total.write_bytes += sample.write_bytes;
                total.rss += sample.rss;
                total.peak_rss += sample.peak_rss;
            }
        }
        Some(total)
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// How many small write + fdatasync rounds per second the disk under `dir` sustains.
pub fn fsync_per_second(dir: &Path, budget: Duration) -> std::io::Result<f64> {
    let path = dir.join(".herald-fsync-probe");
    let mut file = std::fs::File::create(&path)?;
    let block = [0u8; 4096];
    let started = Instant::now();
    let mut rounds = 0u32;
    while started.elapsed() < budget || rounds < 10 {
        file.write_all(&block)?;
        file.sync_data()?;
        rounds += 1;
    }
    let rate = f64::from(rounds) / started.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(rate)
}

/// The number of CPUs this process may run on.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_can_be_sampled() {
        let sample = ProcessSample::read(std::process::id()).unwrap();
        assert!(sample.peak_rss > 0 && sample.rss > 0);
        assert!(sample.cpu_secs >= 0.0);
    }

    #[test]
    fn the_fsync_probe_reports_a_positive_rate() {
        let dir = tempfile::tempdir().unwrap();
        assert!(fsync_per_second(dir.path(), Duration::from_millis(50)).unwrap() > 0.0);
    }
}
