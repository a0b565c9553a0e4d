//! The machine a run measured: core count, CPU model, kernel, date, load.

/// What `docs/BENCHMARKS.md` records about the machine.
#[derive(Clone, Debug)]
pub struct Machine {
    /// Logical CPUs available to the process (`nproc`).
    pub nproc: usize,
    /// `model name` of the first CPU in `/proc/cpuinfo`.
    pub cpu: String,
    /// CPU flags of interest (AVX2 / AVX-512 / SHA extensions).
    pub cpu_flags: String,
    /// The kernel release.
    pub kernel: String,
    /// Total memory, GiB.
    pub mem_gib: f64,
    /// UTC date and time of the run (`YYYY-MM-DD HH:MM UTC`).
    pub date: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Machine {
    /// Reads `/proc` and the clock.
    pub fn detect() -> Self {
        let cpuinfo = read("/proc/cpuinfo");
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        let flags = field("flags");
        let flags: Vec<&str> = flags.split_whitespace().collect();
        let cpu_flags = ["avx2", "avx512f", "sha_ni"]
            .iter()
            .filter(|f| flags.contains(f))
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        let mem_kib: f64 = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Machine {
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu: field("model name"),
            cpu_flags,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            mem_gib: mem_kib / (1024.0 * 1024.0),
            date: utc_now(),
        }
    }
}

/// The 1-minute load average.
pub fn loadavg() -> String {
    read("/proc/loadavg")
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
