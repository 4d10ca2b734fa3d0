//! Ports for the services a test starts: free when asked, and claimed across the test
//! processes of this machine until the service binds them.

use std::sync::atomic::Ordering;

/// A port for a service to listen on, free when asked and handed to no other test
/// process for a while. Not one the kernel would hand out itself (`bind(0)` does, and so
/// does every outgoing connection, which could take it before the service binds it):
/// picked below the ephemeral range (32768 and up on Linux), starting at a point that
/// differs per process and call.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// Where the test center whose API listens on `api_port` serves the IK dictionaries: the
/// port above it ([`free_center_port`] reserves both).
pub fn dictionary_port(api_port: u16) -> u16 {
    api_port.wrapping_add(1)
}

/// Where the test center whose API listens on `api_port` serves its console: two ports
/// above it ([`free_center_port`] reserves it too).
pub fn console_port(api_port: u16) -> u16 {
    api_port.wrapping_add(2)
}

/// A port for a center's API whose [`dictionary_port`] and [`console_port`] are free and
/// reserved as well.
pub fn free_center_port() -> u16 {
    free_ports(3)
}

/// The first of `count` consecutive ports, each free when asked and reserved for this
/// process (see [`reserve_port`]).
fn free_ports(count: u16) -> u16 {
    use std::sync::atomic::AtomicU32;
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let first = (LOW + seed.wrapping_add(n.wrapping_mul(7_919)) % SPAN) as u16;
        let ports = first..first + count;
        if ports
            .clone()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
            && ports.clone().all(reserve_port)
        {
            return first;
        }
    }
    panic!("no {count} free ports in {LOW}..{}", LOW + SPAN)
}

/// Claims `port` across the test processes of this machine: a port free when one test
/// asked is still unbound until its service starts, and another test process must not be
/// handed it in between. A claim is a file created exclusively, and lapses after a while
/// (a service binds its port within seconds).
fn reserve_port(port: u16) -> bool {
    const CLAIM_LASTS: std::time::Duration = std::time::Duration::from_secs(600);
    let dir = crate::paths::target_dir().join("it").join("ports");
    let _ = std::fs::create_dir_all(&dir);
    let claim = dir.join(port.to_string());
    let lapsed = std::fs::metadata(&claim)
        .and_then(|m| m.modified())
        .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > CLAIM_LASTS));
    if lapsed {
        let _ = std::fs::remove_file(&claim);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&claim)
        .is_ok()
}
