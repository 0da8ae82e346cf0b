//! The PostgreSQL store (`--state-url`): thread documents shared by several gateway instances.
//!
//! Each thread row names the instance that holds it and a fencing epoch. An instance writes a
//! thread only while it holds it: every save is conditional on (owner, epoch), and zero rows
//! updated means the thread is not this instance's any more (`StoreError::NotHeld`: the run fails
//! closed, as on any failed save). Admission is one transaction under the row's lock: the
//! holder's liveness (its heartbeat in `agui_instances`, `lease`), the decision, the new document
//! and an epoch bump. A thread held by another live instance is not decided here: the caller
//! forwards the request to that instance. One whose holder is dead is taken over.
//!
//! The document is the file store's JSON, byte for byte (`doc.to_json()`); the row also keeps the
//! thread's active run and its count of pending interrupts, for operators' queries. A document
//! is bounded as in the file store (`MAX_DOC_BYTES`): a larger one is not written, and one found
//! larger is refused by its length, which the server gives without sending the text.

mod beat;
mod lease;
mod listing;
mod rows;
mod schema;
mod sql;
pub mod tls;
mod transcript;

use sql::{DELETIONS, FORGET_INSTANCES, GONE, HOLD, HOLDER, LIVENESS, LOCK_ROW, SAVE};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use lease::{Lapse, Lease};

use super::{
    Admission, BoxFuture, Claim, Decide, Documents, History, Ownership, Peer, StoreError, ThreadDoc,
};
use rows::{columns, parse, LOAD, MAX_DOC};

/// Every database operation is bounded: a database that is down or restarting gives a clear
/// `STATE_UNAVAILABLE` within seconds, never a request that hangs.
const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections kept per instance.
const POOL_SIZE: usize = 16;

/// The server gives up too: a statement waiting on a lock, or running, is cancelled before the
/// client's own bound, and a session left inside a transaction (its instance frozen, say) is
/// ended, which frees the rows it locked.
const SERVER_LIMITS: &str = "-c lock_timeout=2000 -c statement_timeout=2500 \
    -c idle_in_transaction_session_timeout=5000";

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

async fn bounded<T>(
    what: &'static str,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(OP_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable(format!("{what}: timed out"))))
}

/// A row as [`LOCK_ROW`] reads it.
struct Locked {
    doc: Option<ThreadDoc>,
    owner: Option<String>,
    epoch: i64,
    url: Option<String>,
    alive: bool,
}

struct Inner {
    pool: Pool,
    /// For heartbeats only.
    beats: Pool,
    /// This process's instance id (new at every start).
    me: String,
    advertise_url: String,
    lease: Arc<Lease>,
    /// The epoch of each thread this instance holds.
    epochs: Mutex<HashMap<String, i64>>,
    /// The cluster's forward key (`agui_cluster`).
    forward_key: String,
    /// The last heartbeat failed (the database unreachable, before the lease lapses).
    beat_failing: std::sync::atomic::AtomicBool,
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("instance", &self.inner.me)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects, migrates the schema and registers this instance (its first heartbeat). Fails
    /// when the database cannot be reached or migrated: the gateway does not start without its
    /// state.
    pub async fn open(
        url: &str,
        ca_file: Option<&std::path::Path>,
        advertise_url: &str,
        ttl: Duration,
    ) -> Result<PgStore, String> {
        let (url, mode) = tls::split_mode(url)?;
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| format!("invalid --state-url: {e}"))?;
        if mode.is_some() {
            // Encrypted or nothing: a server without TLS is refused.
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        config.connect_timeout(OP_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("iac-code-agui");
        }
        let options = match config.get_options() {
            Some(o) if !o.trim().is_empty() => format!("{o} {SERVER_LIMITS}"),
            _ => SERVER_LIMITS.to_owned(),
        };
        config.options(options);
        let tls = match mode {
            None => None,
            Some(m) => Some(tokio_postgres_rustls::MakeRustlsConnect::new(
                tls::client_config(m, ca_file)?,
            )),
        };
        let pool = |config: tokio_postgres::Config, size: usize| {
            let recycling = ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            };
            let manager = match &tls {
                Some(t) => Manager::from_config(config, t.clone(), recycling),
                None => Manager::from_config(config, NoTls, recycling),
            };
            Pool::builder(manager)
                .max_size(size)
                .wait_timeout(Some(OP_TIMEOUT))
                .create_timeout(Some(OP_TIMEOUT))
                .recycle_timeout(Some(OP_TIMEOUT))
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| format!("state database pool: {e}"))
        };
        // Heartbeats have connections of their own: a pool busy with admissions never starves
        // the lease.
        let beats = pool(config.clone(), 2)?;
        let pool = pool(config, POOL_SIZE)?;
        let mut client = pool.get().await.map_err(|e| tls::connect_error(&e, mode))?;
        schema::migrate(&mut client).await?;
        let forward_key = schema::forward_key(&client).await?;
        drop(client);
        let store = PgStore {
            inner: Arc::new(Inner {
                pool,
                beats,
                me: uuid::Uuid::new_v4().to_string(),
                advertise_url: advertise_url.to_owned(),
                lease: Arc::new(Lease::new(ttl)),
                epochs: Mutex::new(HashMap::new()),
                forward_key,
                beat_failing: Default::default(),
            }),
        };
        store
            .heartbeat()
            .await
            .map_err(|e| format!("cannot register with the state database: {e}"))?;
        if let Ok(c) = store.inner.pool.get().await {
            let _ = c.execute(FORGET_INSTANCES, &[]).await;
        }
        Ok(store)
    }

    pub fn instance_id(&self) -> &str {
        &self.inner.me
    }

    pub fn lease(&self) -> &Arc<Lease> {
        &self.inner.lease
    }

    fn ttl_secs(&self) -> f64 {
        self.inner.lease.ttl().as_secs_f64()
    }

    fn epochs(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.inner.epochs.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.inner.pool.get().await.map_err(unavailable)
    }

    /// Whether this instance may write: its lease holds. A lapsed lease writes nothing (another
    /// instance may hold the thread by now): the thread is not this instance's to write.
    fn may_write(&self) -> Result<(), StoreError> {
        if self.inner.lease.holds() {
            Ok(())
        } else {
            Err(StoreError::LeaseLapsed {
                late: self.inner.lease.is_late(),
            })
        }
    }

    /// Locks a thread's row (creating an empty one) inside `tx`, and reads its holder's
    /// liveness after the lock.
    async fn lock_row(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        thread_id: &str,
    ) -> Result<Locked, StoreError> {
        let st = tx.prepare_cached(LOCK_ROW).await.map_err(unavailable)?;
        let row = tx
            .query_one(&st, &[&thread_id, &MAX_DOC])
            .await
            .map_err(unavailable)?;
        let mut locked = Locked {
            doc: parse(row.get(0), row.get(3), thread_id)?,
            owner: row.get(1),
            epoch: row.get(2),
            url: None,
            alive: false,
        };
        if let Some(owner) = locked.owner.as_deref().filter(|o| *o != self.inner.me) {
            let st = tx.prepare_cached(LIVENESS).await.map_err(unavailable)?;
            if let Some(r) = tx
                .query_opt(&st, &[&owner, &self.ttl_secs()])
                .await
                .map_err(unavailable)?
            {
                locked.url = r.get(0);
                locked.alive = r.get::<_, Option<bool>>(1).unwrap_or(false);
            }
        }
        Ok(locked)
    }

    /// Whether the row shows this instance as its holder. Only this instance makes itself the
    /// holder, so this is its own hold, whatever epoch it remembers (a commit whose answer timed
    /// out leaves it one behind): the row's epoch is the one to write at.
    fn ours(&self, thread_id: &str, row: &Locked) -> bool {
        let ours = row.owner.as_deref() == Some(self.inner.me.as_str());
        if ours {
            self.epochs().insert(thread_id.to_owned(), row.epoch);
        }
        ours
    }

    /// Another live instance holds the row.
    fn elsewhere(&self, row: &Locked) -> Option<Peer> {
        let other = row.owner.as_ref().filter(|o| *o != &self.inner.me)?;
        row.alive.then(|| Peer {
            url: row.url.clone().unwrap_or_default(),
            id: other.clone(),
        })
    }

    /// Writes `doc` (or the row's own) with this instance as the holder, at the next epoch.
    async fn hold(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        thread_id: &str,
        doc: Option<&ThreadDoc>,
    ) -> Result<i64, StoreError> {
        let (json, active, pending, user) = match doc.map(columns).transpose()? {
            Some(c) => (Some(c.doc), c.active_run, c.pending, c.owner_user),
            None => (None, None, 0, None),
        };
        let st = tx.prepare_cached(HOLD).await.map_err(unavailable)?;
        let row = tx
            .query_one(
                &st,
                &[&thread_id, &self.inner.me, &json, &active, &pending, &user],
            )
            .await
            .map_err(unavailable)?;
        Ok(row.get(0))
    }

    async fn do_save(&self, doc: ThreadDoc) -> Result<(), StoreError> {
        self.may_write()?;
        let thread_id = doc.thread_id.clone();
        let Some(epoch) = self.epochs().get(&thread_id).copied() else {
            return Err(StoreError::NotHeld(thread_id));
        };
        let cols = columns(&doc)?;
        let c = self.client().await?;
        let st = c.prepare_cached(SAVE).await.map_err(unavailable)?;
        let n = c
            .execute(
                &st,
                &[
                    &thread_id,
                    &self.inner.me,
                    &cols.doc,
                    &cols.active_run,
                    &cols.pending,
                    &epoch,
                    &cols.owner_user,
                ],
            )
            .await
            .map_err(unavailable)?;
        if n == 0 {
            // Taken over (this instance was presumed dead): never write it again.
            self.epochs().remove(&thread_id);
            return Err(StoreError::NotHeld(thread_id));
        }
        Ok(())
    }

    async fn do_claim(&self, thread_id: String) -> Result<Claim, StoreError> {
        if !self.inner.lease.holds() {
            return Err(StoreError::Unavailable(
                "this instance's lease lapsed".into(),
            ));
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(unavailable)?;
        let row = self.lock_row(&tx, &thread_id).await?;
        if let Some(peer) = self.elsewhere(&row) {
            let _ = tx.rollback().await;
            return Ok(Claim::Elsewhere(peer));
        }
        if self.ours(&thread_id, &row) {
            let _ = tx.rollback().await;
            return Ok(Claim::Here {
                current: Some(row.doc),
                took_over: false,
            });
        }
        if row.doc.is_none() {
            // Nothing to hold (the row was made by the lock): leave no trace.
            let _ = tx.rollback().await;
            return Ok(Claim::Here {
                current: Some(None),
                took_over: false,
            });
        }
        let epoch = self.hold(&tx, &thread_id, row.doc.as_ref()).await?;
        tx.commit().await.map_err(unavailable)?;
        self.epochs().insert(thread_id, epoch);
        Ok(Claim::Here {
            current: Some(row.doc),
            took_over: true,
        })
    }

    /// The thread's row as to its holder: its owner, the owner's advertised URL and whether the
    /// owner is alive (`None`: no row).
    async fn owner_row(
        &self,
        thread_id: &str,
    ) -> Result<Option<(Option<String>, Option<String>, bool)>, StoreError> {
        let c = self.client().await?;
        let st = c.prepare_cached(HOLDER).await.map_err(unavailable)?;
        let row = c
            .query_opt(&st, &[&thread_id, &self.ttl_secs()])
            .await
            .map_err(unavailable)?;
        Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
    }

    async fn do_holder(&self, thread_id: String) -> Result<Claim, StoreError> {
        let here = Claim::Here {
            current: None,
            took_over: false,
        };
        let Some((owner, url, alive)) = self.owner_row(&thread_id).await? else {
            self.epochs().remove(&thread_id);
            return Ok(here);
        };
        match owner {
            Some(o) if o != self.inner.me && alive => Ok(Claim::Elsewhere(Peer {
                url: url.unwrap_or_default(),
                id: o,
            })),
            _ => Ok(here),
        }
    }

    async fn do_held_by(&self, thread_id: String) -> Result<Option<String>, StoreError> {
        Ok(match self.owner_row(&thread_id).await? {
            // This instance's own lease says whether it still holds anything.
            Some((Some(o), _, _)) if o == self.inner.me => self.inner.lease.holds().then_some(o),
            Some((Some(o), _, true)) => Some(o),
            _ => None,
        })
    }

    async fn do_admit(
        &self,
        thread_id: &str,
        held: bool,
        decide: Decide<'_>,
    ) -> Result<Admission, StoreError> {
        if !self.inner.lease.holds() {
            return Err(StoreError::Unavailable(
                "this instance's lease lapsed".into(),
            ));
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(unavailable)?;
        let row = self.lock_row(&tx, thread_id).await?;
        if let Some(peer) = self.elsewhere(&row) {
            let _ = tx.rollback().await;
            return Ok(Admission::Elsewhere(peer));
        }
        let ours = self.ours(thread_id, &row);
        // Read under the row's lock: a delete of the id (which takes it too) is before or after.
        let incarnation = match &row.doc {
            Some(_) => 0,
            None => deletions(&tx, thread_id).await?,
        };
        match decide(row.doc.as_ref(), held && ours, incarnation) {
            Some(next) => {
                let epoch = self.hold(&tx, thread_id, Some(&next)).await?;
                tx.commit().await.map_err(unavailable)?;
                self.epochs().insert(thread_id.to_owned(), epoch);
                Ok(Admission::Here {
                    read: Some(row.doc),
                    current: Some(next),
                    took_over: !ours,
                })
            }
            None => {
                let _ = tx.rollback().await;
                Ok(Admission::Here {
                    current: row.doc.clone(),
                    read: Some(row.doc),
                    took_over: false,
                })
            }
        }
    }
}

/// How many threads of `thread_id` were deleted ([`DELETIONS`]).
async fn deletions(
    c: &impl deadpool_postgres::GenericClient,
    thread_id: &str,
) -> Result<u64, StoreError> {
    let st = c.prepare_cached(DELETIONS).await.map_err(unavailable)?;
    let row = c.query_opt(&st, &[&thread_id]).await.map_err(unavailable)?;
    Ok(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
}

impl Documents for PgStore {
    fn load(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(bounded("load", async move {
            let c = store.client().await?;
            let st = c.prepare_cached(LOAD).await.map_err(unavailable)?;
            let row = c
                .query_opt(&st, &[&id, &MAX_DOC])
                .await
                .map_err(unavailable)?;
            match row {
                Some(r) => parse(r.get(0), r.get(1), &id),
                None => Ok(None),
            }
        }))
    }

    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        let (store, doc) = (self.clone(), doc.clone());
        Box::pin(bounded("save", async move { store.do_save(doc).await }))
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        // Every save is committed when it returns.
        Box::pin(std::future::ready(Ok(())))
    }

    fn reachable(&self) -> BoxFuture<'static, Result<(), String>> {
        // What the heartbeat (every third of the lease's TTL) found: no query of its own, so a
        // probe costs the database nothing.
        let failing = self
            .inner
            .beat_failing
            .load(std::sync::atomic::Ordering::Relaxed);
        let r = match (failing, self.inner.lease.holds()) {
            (false, true) => Ok(()),
            (true, _) => Err("the state database did not answer the last heartbeat".to_owned()),
            (false, false) => Err("the lease on the shared state has lapsed".to_owned()),
        };
        Box::pin(std::future::ready(r))
    }

    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        // Not cheaply: the rows would all be read. The metrics learn them as threads load.
        Box::pin(std::future::ready(Vec::new()))
    }
}

impl Ownership for PgStore {
    fn claim(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(bounded("claim", async move { store.do_claim(id).await }))
    }

    fn holder(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(bounded("holder", async move { store.do_holder(id).await }))
    }

    fn admit<'a>(
        &'a self,
        thread_id: &'a str,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        Box::pin(bounded("admission", self.do_admit(thread_id, held, decide)))
    }

    fn held_by(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<String>, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(bounded("holder", async move { store.do_held_by(id).await }))
    }

    fn holds(&self, thread_id: &str) -> bool {
        self.inner.lease.holds() && self.epochs().contains_key(thread_id)
    }

    fn lease(&self) -> Arc<Lease> {
        self.inner.lease.clone()
    }

    fn instance_id(&self) -> String {
        self.inner.me.clone()
    }

    fn forward_key(&self) -> String {
        self.inner.forward_key.clone()
    }

    fn forget(&self, thread_id: &str) {
        // The row still names this instance: the next admission reads its epoch again.
        self.epochs().remove(thread_id);
    }

    fn release(&self) -> BoxFuture<'static, ()> {
        let store = self.clone();
        Box::pin(async move {
            // First: nothing is written after this, whatever the database says.
            store.inner.lease.give_up();
            let gone = bounded("release", async {
                let c = store.inner.beats.get().await.map_err(unavailable)?;
                c.execute(GONE, &[&store.inner.me])
                    .await
                    .map_err(unavailable)?;
                Ok(())
            })
            .await;
            match gone {
                Ok(()) => tracing::info!("this instance's threads are given up"),
                Err(e) => {
                    tracing::warn!(error = %e, "the threads could not be given up: another instance takes them over once the lease runs out")
                }
            }
        })
    }
}

impl History for PgStore {
    fn append_transcript(
        &self,
        thread_id: &str,
        add: crate::TranscriptAppend,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move { store.append_transcript_now(id, add).await })
    }

    fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<crate::TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)> {
        // Two statements of their own: the transcript's table is not the document's row.
        let appended = transcript.map(|t| self.append_transcript(&doc.thread_id, t));
        let saved = Documents::save(self, doc);
        Box::pin(async move {
            let appended = match appended {
                Some(a) => a.await,
                None => Ok(()),
            };
            (saved.await, appended)
        })
    }

    fn read_transcript(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> BoxFuture<'static, Result<crate::transcript::Page, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move { store.read_transcript_now(id, before, limit).await })
    }

    fn list_threads(
        &self,
        q: crate::listing::ListQuery,
    ) -> BoxFuture<'static, Result<crate::listing::ListPage, StoreError>> {
        let store = self.clone();
        Box::pin(async move { store.list_threads_now(q).await })
    }

    fn update_thread(
        &self,
        thread_id: &str,
        patch: crate::listing::ThreadPatch,
    ) -> BoxFuture<'static, Result<Option<crate::listing::ThreadSummary>, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move { store.update_thread_now(id, patch).await })
    }

    fn delete_thread(&self, thread_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move { store.delete_thread_now(id).await })
    }

    fn incarnation(&self, thread_id: &str) -> BoxFuture<'static, Result<u64, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(bounded("tombstone", async move {
            deletions(&store.client().await?, &id).await
        }))
    }
}
