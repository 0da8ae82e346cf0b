//! Whose listener is on the kernel's port: the kernel's token goes to its own listener only.
//!
//! The port is chosen free, released, and given to the kernel, which binds it a moment later; a
//! local process may bind it first and would be sent the token by the readiness probe. So the
//! probe waits until every listening socket on the port (IPv4 and IPv6, any address) is held by a
//! process of the kernel's process group (`/proc/net/tcp*` inodes against `/proc/<pid>/fd`). A
//! port someone else holds is never probed: the kernel cannot bind it, exits, and is started
//! again on another port.

use std::collections::HashSet;

/// Whether there is a listener on `port` and every one is held by a process of group `pgid`.
pub fn kernel_listens(port: u16, pgid: u32) -> bool {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening(&text, port));
        }
    }
    if inodes.is_empty() {
        return false;
    }
    let held = sockets_of_group(pgid);
    inodes.iter().all(|i| held.contains(i))
}

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` table.
fn listening(table: &str, port: u16) -> Vec<u64> {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (_, p) = f.get(1)?.rsplit_once(':')?;
            let listen = *f.get(3)? == "0A";
            let inode: u64 = f.get(9)?.parse().ok()?;
            (listen && u16::from_str_radix(p, 16).ok()? == port && inode != 0).then_some(inode)
        })
        .collect()
}

/// The socket inodes open in the processes of group `pgid`.
fn sockets_of_group(pgid: u32) -> HashSet<u64> {
    let mut held = HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return held;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Processes come and go during the scan: one that is gone holds nothing.
        let in_group = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| group_of(&s))
            == Some(pgid);
        if !in_group {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Some(inode) = std::fs::read_link(fd.path())
                .ok()
                .and_then(|l| socket_inode(&l.to_string_lossy()))
            {
                held.insert(inode);
            }
        }
    }
    held
}

/// The process group in a `/proc/<pid>/stat` line (the command may hold spaces and parentheses:
/// the fields after the last `)` are state, parent and group).
fn group_of(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// `socket:[123]` → 123.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4444 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn the_table_names_the_listeners_of_a_port() {
        // 0x1F90 = 8080: the listener, not the connection to it.
        assert_eq!(listening(TABLE, 8080), [4242]);
        assert_eq!(listening(TABLE, 8081), [4444]);
        assert!(listening(TABLE, 9).is_empty());
        assert!(listening("", 8080).is_empty());
        assert_eq!(group_of("12 (a ) b) S 1 77 77 0"), Some(77));
        assert_eq!(socket_inode("socket:[4242]"), Some(4242));
        assert_eq!(socket_inode("pipe:[4242]"), None);
    }

    fn own_group() -> u32 {
        #[allow(unsafe_code)]
        // SAFETY: getpgrp cannot fail.
        let g = unsafe { libc::getpgrp() };
        g as u32
    }

    #[test]
    fn a_listener_is_its_holders_group_and_no_other() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert!(kernel_listens(port, own_group()));
        // Another group (a child in a group of its own) does not hold it.
        use std::os::unix::process::CommandExt;
        let mut other = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .expect("sleep");
        assert!(!kernel_listens(port, other.id()));
        let _ = other.kill();
        let _ = other.wait();
        drop(l);
        // Nobody listens.
        assert!(!kernel_listens(port, own_group()));
    }
}
