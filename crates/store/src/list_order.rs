//! Thread summaries in list order, kept ordered as they change (pure): a page of a user's threads
//! is a walk of that user's ordered set from the cursor, whatever the number of threads of
//! others. The file store holds one in memory; PostgreSQL has its own index for the same walk.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use super::listing::{ListPage, ListQuery, ThreadSummary};

/// A thread's place: its activity (the store's exact ordering key), then its id.
type Key = (String, String);

/// Which threads a query walks: one owner's (or those of no owner), archived or not.
type Group = (Option<String>, bool);

#[derive(Default)]
pub struct Ordered {
    threads: HashMap<String, ThreadSummary>,
    /// Each group's threads in order.
    groups: HashMap<Group, BTreeSet<Key>>,
    /// Every thread in order, archived or not: what a caller without a user walks.
    everyone: [BTreeSet<Key>; 2],
}

fn key(s: &ThreadSummary) -> Key {
    let p = s.position();
    (p.at, p.thread_id)
}

fn group(s: &ThreadSummary) -> Group {
    (s.owner.clone(), s.archived)
}

impl Ordered {
    pub fn contains(&self, thread_id: &str) -> bool {
        self.threads.contains_key(thread_id)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Changes a thread's summary (made by `fresh` when there is none) and moves it to its new
    /// place; the summary after.
    pub fn upsert(
        &mut self,
        thread_id: &str,
        fresh: impl FnOnce() -> ThreadSummary,
        change: impl FnOnce(&mut ThreadSummary),
    ) -> ThreadSummary {
        let mut s = match self.take(thread_id) {
            Some(s) => s,
            None => fresh(),
        };
        change(&mut s);
        self.put(s.clone());
        s
    }

    /// Changes a thread's summary if there is one; the summary after.
    pub fn update(
        &mut self,
        thread_id: &str,
        change: impl FnOnce(&mut ThreadSummary),
    ) -> Option<ThreadSummary> {
        let mut s = self.take(thread_id)?;
        change(&mut s);
        self.put(s.clone());
        Some(s)
    }

    pub fn remove(&mut self, thread_id: &str) {
        self.take(thread_id);
    }

    /// The page `q` asks for: its threads, newest activity first, strictly after the cursor.
    pub fn page(&self, q: &ListQuery) -> ListPage {
        let set = match &q.user {
            Some(u) => self.groups.get(&(Some(u.clone()), q.archived)),
            None => Some(&self.everyone[usize::from(q.archived)]),
        };
        let Some(set) = set else {
            return ListPage::default();
        };
        let upper = match &q.after {
            Some(c) => Bound::Excluded((c.at.clone(), c.thread_id.clone())),
            None => Bound::Unbounded,
        };
        let mut walk = set
            .range((Bound::Unbounded, upper))
            .rev()
            .filter_map(|(_, id)| self.threads.get(id));
        let threads: Vec<ThreadSummary> = walk.by_ref().take(q.limit).cloned().collect();
        let more = walk.next().is_some();
        ListPage { threads, more }
    }

    fn take(&mut self, thread_id: &str) -> Option<ThreadSummary> {
        let s = self.threads.remove(thread_id)?;
        let k = key(&s);
        let g = group(&s);
        if let Some(set) = self.groups.get_mut(&g) {
            set.remove(&k);
            if set.is_empty() {
                self.groups.remove(&g);
            }
        }
        self.everyone[usize::from(s.archived)].remove(&k);
        Some(s)
    }

    fn put(&mut self, s: ThreadSummary) {
        let k = key(&s);
        self.groups.entry(group(&s)).or_default().insert(k.clone());
        self.everyone[usize::from(s.archived)].insert(k);
        self.threads.insert(s.thread_id.clone(), s);
    }
}

#[cfg(test)]
mod tests {
    use super::super::listing::{select, Cursor};
    use super::*;

    fn s(id: &str, owner: Option<&str>, at: &str) -> ThreadSummary {
        ThreadSummary {
            owner: owner.map(str::to_owned),
            ..ThreadSummary::new(id, at)
        }
    }

    fn q(user: Option<&str>, archived: bool, after: Option<Cursor>, limit: usize) -> ListQuery {
        ListQuery {
            user: user.map(str::to_owned),
            archived,
            after,
            limit,
        }
    }

    fn ids(p: &ListPage) -> Vec<&str> {
        p.threads.iter().map(|t| t.thread_id.as_str()).collect()
    }

    /// Every query walked page by page gives what a scan of every summary gives, after any
    /// sequence of changes (the scan, `listing::select`, is the definition).
    #[test]
    fn pages_are_those_of_a_scan_after_any_changes() {
        let mut o = Ordered::default();
        let owners = [Some("u"), Some("v"), None];
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for step in 0..2_000 {
            let id = format!("t{}", next(40));
            let at = format!("2026-01-01T00:00:{:02}.000Z", next(60));
            match next(10) {
                0 => o.remove(&id),
                1 => {
                    o.update(&id, |s| s.archived = !s.archived);
                }
                2 => {
                    let owner = owners[next(3) as usize];
                    o.update(&id, |s| s.owner = owner.map(str::to_owned));
                }
                _ => {
                    let owner = owners[next(3) as usize];
                    o.upsert(
                        &id,
                        || s(&id, owner, &at),
                        |x| x.last_activity_at = at.clone(),
                    );
                }
            }
            if step % 50 != 0 {
                continue;
            }
            let all: Vec<ThreadSummary> = o.threads.values().cloned().collect();
            for user in [Some("u"), Some("v"), Some("w"), None] {
                for archived in [false, true] {
                    let mut after = None;
                    loop {
                        let query = q(user, archived, after.clone(), 3);
                        let (got, want) = (o.page(&query), select(all.iter(), &query));
                        assert_eq!(got, want, "step {step}, {query:?}");
                        match (got.more, got.threads.last()) {
                            (true, Some(last)) => after = Some(last.position()),
                            _ => break,
                        }
                    }
                }
            }
        }
        // No group is left behind by the removals and moves.
        for id in o.threads.keys().cloned().collect::<Vec<_>>() {
            o.remove(&id);
        }
        assert_eq!(o.len(), 0);
        assert!(o.groups.is_empty() && o.everyone.iter().all(BTreeSet::is_empty));
    }

    #[test]
    fn a_page_walks_only_its_group() {
        let mut o = Ordered::default();
        for i in 0..1_000 {
            let owner = format!("user-{}", i % 10);
            let id = format!("t{i:04}");
            o.upsert(
                &id,
                || s(&id, Some(&owner), "2026-01-01T00:00:00.000Z"),
                |_| {},
            );
        }
        let p = o.page(&q(Some("user-3"), false, None, 2));
        assert_eq!((ids(&p), p.more), (vec!["t0993", "t0983"], true));
        assert!(o
            .page(&q(Some("nobody"), false, None, 2))
            .threads
            .is_empty());
        assert_eq!(
            o.page(&q(None, false, None, 1)).threads[0].thread_id,
            "t0999"
        );
    }
}
