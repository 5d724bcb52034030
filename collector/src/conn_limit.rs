//! Caps on open connections, for the HTTP and the gRPC listener alike: a cap per listener, a cap per client
//! address, and one descriptor budget that both listeners share.
//!
//! Each accepted socket takes a [`ConnPermit`] before a byte is read and holds it until the connection is gone;
//! a socket that gets none is closed at once (the client sees the connection reset) and the [`Refusal`] is
//! counted by the caller. A client address is an IPv4 address or an IPv6 /64 (one host can own a whole /64, so
//! capping single IPv6 addresses would cap nothing); IPv4-mapped IPv6 addresses count as their IPv4 address.
//!
//! The descriptor budget is the process's soft open-file limit less [`RESERVED_DESCRIPTORS`]: whatever the
//! caps are set to, connections alone never take the descriptors the store needs (a store write that fails with
//! "too many open files" halts writes until the collector restarts), nor those of log segments, outbound
//! notifier and OTLP connections, and the listeners themselves.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Descriptors left out of the connection budget for everything but client connections: the store (sled's
/// files, log segments, the shutdown image), outbound connections (notifiers, OTLP), the listeners, the
/// runtime's own (epoll, eventfds) and standard streams. An idle collector holds about 15; 128 leaves room.
pub const RESERVED_DESCRIPTORS: usize = 128;

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener's cap (`http.max_connections`, `grpc.max_connections`) is reached.
    Listener,
    /// The client address's cap (`http.max_connections_per_ip`, `grpc.max_connections_per_ip`) is reached.
    Address,
    /// Both listeners' connections hold the whole descriptor budget.
    Descriptors,
}

impl Refusal {
    /// The `reason` attribute of the refusal metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Listener => "connection_limit",
            Refusal::Address => "connection_limit_per_ip",
            Refusal::Descriptors => "descriptor_budget",
        }
    }
}

/// The descriptors that client connections of every listener may hold together.
#[derive(Debug)]
pub struct DescriptorBudget {
    limit: usize,
    open: AtomicUsize,
}

impl DescriptorBudget {
    /// A budget of `limit` connections.
    pub fn new(limit: usize) -> Self {
        DescriptorBudget { limit, open: AtomicUsize::new(0) }
    }

    /// The budget of this process: its soft open-file limit less [`RESERVED_DESCRIPTORS`] (see
    /// [`budget_for`]); unbounded where the limit cannot be read or is unlimited.
    pub fn of_process() -> Self {
        Self::new(soft_open_file_limit().map_or(usize::MAX, budget_for))
    }

    /// Most connections all listeners may hold together.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Connections holding a descriptor of the budget now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    fn try_take(&self) -> bool {
        self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limit).then_some(n + 1)).is_ok()
    }

    fn give_back(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection budget under an open-file limit: the limit less [`RESERVED_DESCRIPTORS`], or half of a limit
/// too small to reserve that many.
pub fn budget_for(soft_limit: u64) -> usize {
    let limit = usize::try_from(soft_limit).unwrap_or(usize::MAX);
    limit - RESERVED_DESCRIPTORS.min(limit / 2)
}

/// The soft `RLIMIT_NOFILE` of this process, from `/proc/self/limits` (Linux); `None` elsewhere or when
/// unlimited.
pub fn soft_open_file_limit() -> Option<u64> {
    parse_open_file_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft limit on the `Max open files` line of a `/proc/<pid>/limits` text.
fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find_map(|l| l.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// The address a per-address cap counts: an IPv4 address, or the /64 of an IPv6 one.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

/// One listener's connection caps.
#[derive(Debug)]
pub struct ConnLimiter {
    max: usize,
    per_address: usize,
    budget: Arc<DescriptorBudget>,
    state: Mutex<Open>,
}

/// Connections open on one listener, in total and by client address (addresses with none are removed, so the
/// map never holds more entries than open connections).
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl ConnLimiter {
    /// Caps of `max` connections, `per_address` from one client address, within `budget`.
    pub fn new(max: usize, per_address: usize, budget: Arc<DescriptorBudget>) -> Arc<Self> {
        Arc::new(ConnLimiter { max, per_address, budget, state: Mutex::default() })
    }

    fn state(&self) -> MutexGuard<'_, Open> {
        // The counts stay consistent under any panic (each update is one statement), so a poisoned lock is used.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A permit for a connection from `peer` (None: an address the socket could not tell, counted against the
    /// listener's cap only), or why there is none.
    pub fn try_acquire(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<ConnPermit, Refusal> {
        let key = peer.map(address_key);
        let mut open = self.state();
        // A full listener is named first: with both caps reached, the listener's is the one to raise.
        if open.total >= self.max {
            return Err(Refusal::Listener);
        }
        if let Some(k) = key {
            if open.by_address.get(&k).copied().unwrap_or(0) >= self.per_address {
                return Err(Refusal::Address);
            }
        }
        if !self.budget.try_take() {
            return Err(Refusal::Descriptors);
        }
        open.total += 1;
        if let Some(k) = key {
            *open.by_address.entry(k).or_insert(0) += 1;
        }
        Ok(ConnPermit { limiter: self.clone(), key })
    }

    /// Connections open on this listener.
    pub fn open(&self) -> usize {
        self.state().total
    }

    /// The listener's cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The per-address cap.
    pub fn per_address(&self) -> usize {
        self.per_address
    }

    /// The shared descriptor budget.
    pub fn budget(&self) -> &DescriptorBudget {
        &self.budget
    }
}

/// A connection's place under its listener's caps, given back when dropped.
#[derive(Debug)]
pub struct ConnPermit {
    limiter: Arc<ConnLimiter>,
    key: Option<IpAddr>,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut open = self.limiter.state();
        open.total = open.total.saturating_sub(1);
        if let Some(k) = self.key {
            if let Some(n) = open.by_address.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    open.by_address.remove(&k);
                }
            }
        }
        drop(open);
        self.limiter.budget.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().expect("ip"))
    }

    #[test]
    fn caps_per_address_per_listener_and_by_the_shared_budget() {
        let budget = Arc::new(DescriptorBudget::new(5));
        let http = ConnLimiter::new(4, 2, budget.clone());
        let grpc = ConnLimiter::new(10, 10, budget.clone());
        let a1 = http.try_acquire(ip("10.0.0.1")).expect("first");
        let a2 = http.try_acquire(ip("10.0.0.1")).expect("second");
        assert_eq!(http.try_acquire(ip("10.0.0.1")).map(|_| ()), Err(Refusal::Address));
        let b1 = http.try_acquire(ip("10.0.0.2")).expect("another address");
        let b2 = http.try_acquire(None).expect("no address: the listener's cap only");
        assert_eq!(http.try_acquire(ip("10.0.0.3")).map(|_| ()), Err(Refusal::Listener));
        assert_eq!(http.open(), 4);
        // The other listener has room of its own but shares the budget: one descriptor left.
        let g1 = grpc.try_acquire(ip("10.0.0.3")).expect("the last of the budget");
        assert_eq!(grpc.try_acquire(ip("10.0.0.3")).map(|_| ()), Err(Refusal::Descriptors));
        assert_eq!(budget.open(), 5);
        // Permits give their places back when dropped, each under its own address.
        drop(a1);
        assert_eq!(budget.open(), 4);
        let a3 = http.try_acquire(ip("10.0.0.1")).expect("the address has room again");
        drop((a2, a3, b1, b2, g1));
        assert_eq!((http.open(), grpc.open(), budget.open()), (0, 0, 0));
        assert!(http.state().by_address.is_empty(), "no entry stays for an address without connections");
    }

    #[test]
    fn ipv6_addresses_count_by_64_and_mapped_ipv4_as_ipv4() {
        let l = ConnLimiter::new(100, 1, Arc::new(DescriptorBudget::new(100)));
        let _a = l.try_acquire(ip("2001:db8:1:2::1")).expect("first of the /64");
        assert_eq!(l.try_acquire(ip("2001:db8:1:2:ffff::9")).map(|_| ()), Err(Refusal::Address));
        let _b = l.try_acquire(ip("2001:db8:1:3::1")).expect("another /64");
        let _c = l.try_acquire(ip("192.0.2.7")).expect("ipv4");
        assert_eq!(l.try_acquire(ip("::ffff:192.0.2.7")).map(|_| ()), Err(Refusal::Address));
    }

    #[test]
    fn the_budget_reserves_descriptors_under_the_open_file_limit() {
        assert_eq!(budget_for(1024), 1024 - RESERVED_DESCRIPTORS);
        assert_eq!(budget_for(65_536), 65_536 - RESERVED_DESCRIPTORS);
        assert_eq!(budget_for(100), 50, "a small limit keeps half");
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             95000                95000                processes \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_file_limit(text), Some(1024));
        assert_eq!(parse_open_file_limit("Max open files            unlimited            unlimited   files\n"), None);
        assert!(soft_open_file_limit().is_some(), "readable on Linux");
    }
}
