//! What the machine offers the gateway's kernels (`--kernels auto`): the memory this process
//! may use, its cgroup's limit when it has one, else the machine's.

/// Bytes of memory the process may use; `None` when nothing says.
pub(super) fn memory_bytes() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let total = meminfo.as_deref().and_then(mem_total);
    match cgroup.as_deref().and_then(cgroup_limit) {
        Some(limit) => Some(total.map_or(limit, |t| t.min(limit))),
        None => total,
    }
}

/// cgroup v2 `memory.max`: a byte count, or `max` (no limit).
fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `/proc/meminfo`'s `MemTotal`, in bytes.
fn mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_read_from_the_cgroup_and_meminfo() {
        assert_eq!(cgroup_limit("max\n"), None);
        assert_eq!(cgroup_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(cgroup_limit("garbage"), None);
        let meminfo = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_576_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: x kB\n"), None);
        assert!(memory_bytes().is_some_and(|m| m > 0), "this machine says");
    }
}
