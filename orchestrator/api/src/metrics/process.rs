//! The standard `process_*` metrics of the Prometheus client libraries, read from
//! Linux's `/proc/self` at each scrape (absent where `/proc` is not): resident and
//! virtual memory, CPU seconds, open and allowed file descriptors, threads, and the
//! start time.

use super::exposition::Out;

/// Clock ticks per second of `/proc/self/stat`'s times (`USER_HZ`, 100 on every
/// architecture Linux runs on).
const USER_HZ: f64 = 100.0;

pub(super) fn metrics(o: &mut Out) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
    };
    if let Some(v) = kib("VmRSS") {
        o.add_plain(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes",
            v * 1024.0,
        );
    }
    if let Some(v) = kib("VmSize") {
        o.add_plain(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes",
            v * 1024.0,
        );
    }
    if let Some(v) = kib("Threads") {
        o.add_plain("process_threads", "gauge", "Threads of the process", v);
    }
    if let Some((cpu, start_ticks)) = stat() {
        o.add_plain(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds",
            cpu,
        );
        if let Some(boot) = boot_time() {
            o.add_plain(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds",
                boot + start_ticks / USER_HZ,
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        // the directory's own handle, open while it is read, is not counted
        let n = fds.count().saturating_sub(1);
        o.add_plain(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors",
            n as f64,
        );
    }
    if let Some(max) = max_fds() {
        o.add_plain(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors",
            max,
        );
    }
}

/// `(utime + stime in seconds, starttime in ticks since boot)` from `/proc/self/stat`.
fn stat() -> Option<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // the command name (field 2) may hold spaces and parentheses: fields follow its last ')'
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15, starttime 22
    let num = |field: usize| f.get(field - 3)?.parse::<f64>().ok();
    Some(((num(14)? + num(15)?) / USER_HZ, num(22)?))
}

/// The boot time from `/proc/stat`, read once (the file is long on a many-core host).
fn boot_time() -> Option<f64> {
    static BOOT: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
    })
}

fn max_fds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_reads_itself() {
        let mut o = Out::default();
        metrics(&mut o);
        let text = o.render();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
        };
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(!text.contains("powerplane_process"), "{text}");
    }
}
