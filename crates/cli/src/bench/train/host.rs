//! What the host tells about itself: the CPU's name and the process's peak
//! resident memory (Linux `/proc`).

/// The CPU's `model name` from `/proc/cpuinfo`, or the architecture where
/// there is none.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// Threads the CPU backends compute with: `RAYON_NUM_THREADS` if set (rayon
/// reads it), else the available parallelism.
pub fn cpu_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// Resets the process's resident high-water mark (`VmHWM`) to its current
/// resident size by writing `5` to `/proc/self/clear_refs` (Linux 4.0+).
/// Returns whether that worked.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// `VmHWM` of `/proc/self/status`, bytes: the largest resident set since
/// the process started or the last [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Option<u64> {
    parse_vm_hwm(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// `VmHWM:  N kB` of a `/proc/<pid>/status` text, in bytes.
fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line["VmHWM:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then(|| n * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_hwm_is_read_in_kibibytes() {
        let status = "Name:\tferrotron\nVmPeak:\t  900 kB\nVmHWM:\t  2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(2048 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS: 1 kB\n"), None);
        #[cfg(target_os = "linux")]
        {
            // This process has touched more than a page.
            assert!(peak_rss_bytes().is_some_and(|b| b > 4096));
            let _ = reset_peak_rss();
        }
    }
}
