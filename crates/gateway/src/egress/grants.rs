//! Who may spend through the egress, and with what: capabilities, as pure data.
//!
//! A kernel is started with a capability of its own: in its base URL's path (which names the
//! kernel) and as its API key. A run gets one more, in place of the request's key, which carries
//! the run's user and the request's own key and headers (`llmApiKey`, `llmHeaders`). A request is
//! admitted when its path names a kernel and its key is that kernel's, or a live run's of the
//! kernel's user (any user's on a shared kernel, which every user's runs reach anyway). A run's
//! capability lives while the run does, and [`GRACE`] after (what the kernel does at the end of
//! a turn); then it is refused, as any unknown one is.
//!
//! The runs of one thread at once (a guidance run beside the pipeline's run it steers) share one
//! capability: the kernel keeps the key of a thread's latest message for the whole context, so
//! a guidance run's own would otherwise lapse under the run that goes on. The latest run's key
//! is the one spent (as the kernel would), its headers when it has some.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a run's capability is honoured after the run ends.
pub const GRACE: Duration = Duration::from_secs(5);

/// A capability's secret: 32 random bytes, hex.
pub fn mint() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// The account a request is counted to: a user's key (see `kernel::tenant::user_key`), or none
/// (a shared kernel's own calls, outside any run).
pub type Account = Option<String>;

/// What a request may spend, once admitted.
#[derive(Clone)]
pub struct Spend {
    pub account: Account,
    /// The run's own key, in place of the operator's.
    pub key: Option<String>,
    /// The run's own headers, added upstream.
    pub headers: Vec<(String, String)>,
    /// The run's mark that a call was refused for the budget.
    pub refused: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for Spend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spend")
            .field("account", &self.account)
            .field("key", &self.key.as_ref().map(|_| "<hidden>"))
            .field("headers", &self.headers.len())
            .field("run", &self.refused.is_some())
            .finish()
    }
}

/// A run asking for its capability.
pub struct NewRun {
    pub account: String,
    pub thread: String,
    pub key: Option<String>,
    pub headers: Vec<(String, String)>,
}

/// Why a request is refused (all are answered the same, 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The path names no kernel.
    UnknownKernel,
    /// No key, or one that is neither the kernel's nor a live run's.
    UnknownKey,
    /// A run's key whose run ended more than [`GRACE`] ago.
    Ended,
    /// A run's key presented by another user's kernel.
    OtherUser,
}

struct Kernel {
    account: Account,
}

struct Run {
    account: String,
    key: Option<String>,
    headers: Vec<(String, String)>,
    refused: Arc<AtomicBool>,
    /// Runs holding it.
    holders: usize,
    /// When the last of them ended.
    ended: Option<Instant>,
}

/// The live capabilities.
#[derive(Default)]
pub struct Grants {
    kernels: HashMap<String, Kernel>,
    /// A kernel's capability by its account (the shared kernels' under none).
    kernel_of: HashMap<Account, String>,
    runs: HashMap<String, Run>,
    /// The live capability of a thread's runs, by account and thread.
    run_of: HashMap<(String, String), String>,
}

impl Grants {
    /// The capability of a kernel of `account` about to start: a user's is new at each start
    /// of their kernel (the one before is refused from then on: a process its agent left
    /// behind spends no more); the shared kernels keep theirs.
    pub fn kernel(&mut self, account: Account) -> String {
        match self.kernel_of.get(&account) {
            Some(t) if account.is_none() => return t.clone(),
            Some(t) => {
                let old = t.clone();
                self.kernels.remove(&old);
            }
            None => {}
        }
        let token = mint();
        self.kernels.insert(
            token.clone(),
            Kernel {
                account: account.clone(),
            },
        );
        self.kernel_of.insert(account, token.clone());
        token
    }

    /// A new run's capability for `account` on `thread`, spending `key` (else the operator's)
    /// with `headers`, marking `refused` when a call is refused for the budget: that of the
    /// thread's runs going on, if any (given this run's key, and its headers when it has some),
    /// else a new one. Runs ended past the grace are forgotten now.
    pub fn run(&mut self, run: NewRun, now: Instant) -> (String, Arc<AtomicBool>) {
        let live = |r: &Run| {
            r.ended
                .is_none_or(|e| now.saturating_duration_since(e) <= GRACE)
        };
        self.runs.retain(|_, r| live(r));
        let runs = &self.runs;
        self.run_of.retain(|_, t| runs.contains_key(t));
        let at = (run.account.clone(), run.thread.clone());
        if let Some(r) =
            (self.run_of.get(&at)).and_then(|t| Some((t.clone(), self.runs.get_mut(t)?)))
        {
            let (token, r) = r;
            if r.holders > 0 {
                r.holders += 1;
                r.key = run.key;
                if !run.headers.is_empty() {
                    r.headers = run.headers;
                }
                return (token, r.refused.clone());
            }
        }
        let token = mint();
        let refused = Arc::new(AtomicBool::new(false));
        self.runs.insert(
            token.clone(),
            Run {
                account: run.account,
                key: run.key,
                headers: run.headers,
                refused: refused.clone(),
                holders: 1,
                ended: None,
            },
        );
        self.run_of.insert(at, token.clone());
        (token, refused)
    }

    /// A run holding `token` has ended: once none does, it lapses after the grace.
    pub fn end_run(&mut self, token: &str, now: Instant) {
        if let Some(r) = self.runs.get_mut(token) {
            r.holders = r.holders.saturating_sub(1);
            if r.holders == 0 {
                r.ended.get_or_insert(now);
            }
        }
    }

    /// Runs whose capability is still honoured.
    #[cfg(test)]
    pub fn live_runs(&self, now: Instant) -> usize {
        self.runs
            .values()
            .filter(|r| {
                r.ended
                    .is_none_or(|e| now.saturating_duration_since(e) <= GRACE)
            })
            .count()
    }

    /// What a request whose path names `kernel` and that presents `key` may spend.
    pub fn admit(&self, kernel: &str, key: Option<&str>, now: Instant) -> Result<Spend, Denied> {
        let k = self.kernels.get(kernel).ok_or(Denied::UnknownKernel)?;
        let key = key.ok_or(Denied::UnknownKey)?;
        if same(key, kernel) {
            return Ok(Spend {
                account: k.account.clone(),
                key: None,
                headers: Vec::new(),
                refused: None,
            });
        }
        let run = self.runs.get(key).ok_or(Denied::UnknownKey)?;
        if run
            .ended
            .is_some_and(|e| now.saturating_duration_since(e) > GRACE)
        {
            return Err(Denied::Ended);
        }
        if k.account.as_ref().is_some_and(|a| *a != run.account) {
            return Err(Denied::OtherUser);
        }
        Ok(Spend {
            account: Some(run.account.clone()),
            key: run.key.clone(),
            headers: run.headers.clone(),
            refused: Some(run.refused.clone()),
        })
    }
}

/// Equal secrets, compared in constant time.
fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_run(account: &str, thread: &str, key: Option<&str>, h: Vec<(String, String)>) -> NewRun {
        NewRun {
            account: account.into(),
            thread: thread.into(),
            key: key.map(str::to_owned),
            headers: h,
        }
    }

    fn alice() -> Account {
        Some("alice".into())
    }

    #[test]
    fn a_kernel_spends_its_own_account_with_the_operators_key() {
        let mut g = Grants::default();
        let old = g.kernel(alice());
        let k = g.kernel(alice());
        assert_ne!(k, old, "a new one at each start of her kernel");
        assert_eq!(k.len(), 64);
        let now = Instant::now();
        assert_eq!(
            g.admit(&old, Some(&old), now).err(),
            Some(Denied::UnknownKernel)
        );
        let s = g.admit(&k, Some(&k), now).unwrap();
        assert_eq!((s.account, s.key, s.headers), (alice(), None, vec![]));
        assert_eq!(g.admit(&k, None, now).err(), Some(Denied::UnknownKey));
        assert_eq!(g.admit(&k, Some("x"), now).err(), Some(Denied::UnknownKey));
        assert_eq!(
            g.admit("x", Some(&k), now).err(),
            Some(Denied::UnknownKernel)
        );
        let shared = g.kernel(None);
        assert_ne!(shared, k);
        assert_eq!(g.kernel(None), shared, "the shared kernels keep theirs");
        assert_eq!(g.admit(&shared, Some(&shared), now).unwrap().account, None);
    }

    #[test]
    fn a_run_spends_its_key_and_headers_on_its_users_kernel_until_the_grace_ends() {
        let mut g = Grants::default();
        let (ka, kb, shared) = (
            g.kernel(alice()),
            g.kernel(Some("bob".into())),
            g.kernel(None),
        );
        let t0 = Instant::now();
        let h = vec![("X-Org".to_owned(), "o1".to_owned())];
        let (run, _) = g.run(new_run("alice", "t1", Some("her-key"), h.clone()), t0);
        let s = g.admit(&ka, Some(&run), t0).unwrap();
        assert_eq!(
            (s.account, s.key.as_deref(), s.headers),
            (alice(), Some("her-key"), h)
        );
        assert_eq!(g.admit(&kb, Some(&run), t0).err(), Some(Denied::OtherUser));
        assert!(g.admit(&shared, Some(&run), t0).is_ok(), "shared kernels");
        assert_eq!(g.live_runs(t0), 1);
        g.end_run(&run, t0);
        assert!(
            g.admit(&ka, Some(&run), t0 + GRACE).is_ok(),
            "within the grace"
        );
        let later = t0 + GRACE + Duration::from_millis(1);
        assert_eq!(g.admit(&ka, Some(&run), later).err(), Some(Denied::Ended));
        assert_eq!(g.live_runs(later), 0);
        // Forgotten at the next run's start: unknown from then on.
        let _ = g.run(new_run("bob", "t2", None, vec![]), later);
        assert_eq!(
            g.admit(&ka, Some(&run), later).err(),
            Some(Denied::UnknownKey)
        );
        // A later end does not extend the grace.
        let (r2, _) = g.run(new_run("alice", "t3", None, vec![]), t0);
        g.end_run(&r2, t0);
        g.end_run(&r2, later);
        assert_eq!(g.admit(&ka, Some(&r2), later).err(), Some(Denied::Ended));
    }

    /// A guidance run beside the run it steers shares its capability (the kernel keeps the
    /// latest message's key for the thread's context): it lapses only after both ended.
    #[test]
    fn a_threads_runs_at_once_share_one_capability() {
        let mut g = Grants::default();
        let k = g.kernel(alice());
        let t0 = Instant::now();
        let h = vec![("X-Org".to_owned(), "o1".to_owned())];
        let (main, flag) = g.run(new_run("alice", "t1", Some("k1"), h.clone()), t0);
        let (guide, flag2) = g.run(new_run("alice", "t1", Some("k2"), vec![]), t0);
        assert_eq!(guide, main);
        assert!(Arc::ptr_eq(&flag, &flag2));
        let s = g.admit(&k, Some(&main), t0).unwrap();
        assert_eq!(
            (s.key.as_deref(), s.headers),
            (Some("k2"), h),
            "the latest key"
        );
        let (other, _) = g.run(new_run("alice", "t2", None, vec![]), t0);
        assert_ne!(other, main, "another thread's");
        g.end_run(&guide, t0);
        let later = t0 + GRACE * 3;
        assert!(
            g.admit(&k, Some(&main), later).is_ok(),
            "the main run goes on"
        );
        g.end_run(&main, later);
        let after = later + GRACE + Duration::from_millis(1);
        assert_eq!(g.admit(&k, Some(&main), after).err(), Some(Denied::Ended));
        // The thread's next run gets a new one.
        let (next, _) = g.run(new_run("alice", "t1", None, vec![]), after);
        assert_ne!(next, main);
    }

    #[test]
    fn a_spend_never_prints_its_key() {
        let s = Spend {
            account: None,
            key: Some("sk-secret".into()),
            headers: vec![("Authorization".into(), "Bearer hdr-secret".into())],
            refused: None,
        };
        let shown = format!("{s:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
