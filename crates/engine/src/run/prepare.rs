//! The costly part of a request, between validation and admission: its images decoded and its
//! workspace created. Both wait until a trial of the admission decision (`admit::trial`, which
//! admission runs first) says the thread would admit the request, so one refused for its thread (busy, a used run id,
//! another binding, a resume with nothing to resume) costs no decode and leaves no directory.
//! Decoding runs on the blocking pool under the [`DecodeGate`], which bounds how many images are
//! decoded at once across requests (`--max-image-decodes`).
//!
//! Why not after the admission itself: admission makes the new thread document durable (the run
//! id consumed, the binding, an epoch with a shared store) before the stream starts, and a decode
//! that failed after it would have to take all of that back. Done before, a failure is a plain
//! 400 with nothing saved. What the trial cannot see is a concurrent admission on the same thread
//! between the trial and the admission: the request that loses then decoded for nothing, and the
//! directory it created stays. It is not removed: the request that won (two tries of one request
//! at two instances, say) may be running in that very directory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::{msg, ApiError, Code};
use crate::validate::cwd;

use super::request::RunRequest;
use super::Runtime;

/// Bounds the image decodes running at once; counts them (running now, and in all).
#[derive(Debug)]
pub struct DecodeGate {
    permits: Arc<Semaphore>,
    running: AtomicUsize,
    /// The most that ran at once (tests).
    peak: AtomicUsize,
}

impl DecodeGate {
    /// A gate letting `n` (at least one) decodes run at once.
    pub fn new(n: usize) -> DecodeGate {
        DecodeGate {
            permits: Arc::new(Semaphore::new(n.max(1))),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Runs the CPU-bound `work` on the blocking pool once a permit is free; waiters are served
    /// in order. The permit is held until `work` returns, even if the caller stops waiting.
    pub async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        let gate = self.clone();
        tokio::task::spawn_blocking(move || {
            let now = gate.running.fetch_add(1, Ordering::SeqCst) + 1;
            gate.peak.fetch_max(now, Ordering::SeqCst);
            let out = work();
            gate.running.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
            out
        })
        .await
        .ok()
    }

    /// The most decodes that ran at once so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// Whether `req` has a costly part.
pub fn is_costly(req: &RunRequest) -> bool {
    req.create_cwd
        || req
            .user_message
            .as_ref()
            .is_some_and(|m| m.images_to_decode() > 0)
}

/// The request with its images decoded and its workspace created (admission calls it once the
/// trial says the thread would admit the request).
pub async fn costly_part(rt: &Runtime, mut req: RunRequest) -> Result<RunRequest, ApiError> {
    if let Some(mut message) = req.user_message.take() {
        let images = message.images_to_decode();
        if images > 0 {
            rt.metrics().images_decoded(images);
            message = rt
                .decode_gate()
                .run(move || message.decode_images().map(|()| message))
                .await
                .ok_or_else(|| ApiError::new(Code::InvalidInput, msg::IMAGE_INVALID))??;
        }
        req.user_message = Some(message);
    }
    if req.create_cwd {
        let path = req.cwd.clone();
        // With users' own kernels: made beneath the user's root without following a symlink
        // their kernel may have put on the way, and given to the kernels' uid.
        let own = rt.kernels().tenants().map(|t| {
            let iso = t.isolation();
            let key = kernel::tenant::user_key(req.caller.user.as_deref());
            (iso.workspaces_of(&key), iso.identity)
        });
        tokio::task::spawn_blocking(move || match own {
            Some((roots, identity)) => kernel::isolate::make_workspace(&path, &roots, identity)
                .map_err(|_| ApiError::new(Code::InvalidInput, msg::CWD_CANNOT_CREATE)),
            None => cwd::create(&path),
        })
        .await
        .map_err(|_| ApiError::new(Code::InvalidInput, msg::CWD_CANNOT_CREATE))??;
        req.create_cwd = false;
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// However many decodes are asked for at once, no more than the gate's count run together,
    /// and every one runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_gate_bounds_concurrent_decodes() {
        for n in [1, 2, 3] {
            let gate = Arc::new(DecodeGate::new(n));
            let done = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..12)
                .map(|_| {
                    let (gate, done) = (gate.clone(), done.clone());
                    tokio::spawn(async move {
                        gate.run(move || {
                            std::thread::sleep(Duration::from_millis(20));
                            done.fetch_add(1, Ordering::SeqCst);
                        })
                        .await
                    })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await.unwrap(), Some(()));
            }
            assert_eq!(done.load(Ordering::SeqCst), 12);
            assert_eq!(
                gate.peak(),
                n,
                "at most {n} at once, and the gate does let {n} run"
            );
        }
    }

    /// A caller that stops waiting (its client went away) does not free the permit before its
    /// decode is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_decode_keeps_its_permit_until_it_ends() {
        let gate = Arc::new(DecodeGate::new(1));
        let g = gate.clone();
        let first = tokio::spawn(async move {
            g.run(|| std::thread::sleep(Duration::from_millis(200)))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.abort();
        let started = std::time::Instant::now();
        gate.run(|| ()).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(gate.peak(), 1);
    }
}
