//! Proving a peer before anything is sent to it: with a cluster secret, the forwarding instance
//! first asks the holder's advertised URL to prove it knows the secret
//! (`GET /cluster/v1/hello?nonce=…`, answered with the instance's id, its advertised URL and an
//! HMAC over the nonce, the id and that URL; the URL must be the one dialled, so an answer relayed
//! from another instance by whoever rewrote the database proves nothing), and the id must be the
//! holder's the database names. A listener that cannot prove it (an `advertise_url` rewritten in
//! the database to point elsewhere) receives that question and nothing else: no token, no body.
//! A proof is kept for [`PROVEN_FOR`] per URL, and used only for the instance it proved: one
//! started again at the URL (a new id) is asked again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::Method;
use hmac::{Hmac, Mac};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::{send, Dest, Unreachable};
use store::Peer;

/// How long a proven peer is trusted without asking again.
pub const PROVEN_FOR: Duration = Duration::from_secs(60);
/// The whole question, and the most bytes of its answer.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const HELLO_MAX: usize = 4096;
/// A nonce: 32 to 128 hex digits.
const NONCE: std::ops::RangeInclusive<usize> = 32..=128;

/// The peers proven lately: URL → (instance id, when).
#[derive(Default)]
pub struct Peers(Mutex<HashMap<String, (String, Instant)>>);

impl Peers {
    /// The id of the instance at `holder`'s URL, proven to be the holder's (asked again after
    /// [`PROVEN_FOR`], and at once when the holder is not the instance proven there before).
    pub(super) async fn prove(
        &self,
        holder: &Peer,
        dest: &Dest<'_>,
        secret: &[u8],
    ) -> Result<String, Unreachable> {
        let base = holder.url.as_str();
        {
            let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((id, at)) = map.get(base) {
                if at.elapsed() < PROVEN_FOR && *id == holder.id {
                    return Ok(id.clone());
                }
            }
        }
        let id = tokio::time::timeout(HELLO_TIMEOUT, ask(base, dest, secret))
            .await
            .map_err(|_| Unreachable("the peer did not prove itself in time".into()))??;
        if id != holder.id {
            // Proven, but another instance than the holder (the holder died and another took its
            // URL): it would refuse the forward as not its own thread.
            return Err(Unreachable(
                "the instance at the holder's URL is another instance".into(),
            ));
        }
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A few peers: a map that grows past them is pruned of old proofs.
        if map.len() > 1024 {
            map.retain(|_, (_, at)| at.elapsed() < PROVEN_FOR);
        }
        map.insert(base.to_owned(), (id.clone(), Instant::now()));
        Ok(id)
    }
}

fn proof(secret: &[u8], nonce: &str, instance: &str, url: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(format!("iac-code-agui-hello-v1\n{nonce}\n{instance}\n{url}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

async fn ask(base: &str, dest: &Dest<'_>, secret: &[u8]) -> Result<String, Unreachable> {
    let nonce = hex::encode(rand::random::<[u8; 24]>());
    let target = format!("{}/cluster/v1/hello?nonce={nonce}", dest.base_path);
    let answer = send(dest, Method::GET, &target, Vec::new(), bytes::Bytes::new()).await?;
    let refused = |why: &str| Unreachable(format!("the peer did not prove itself: {why}"));
    if !answer.status().is_success() {
        return Err(refused(&format!("it answered {}", answer.status())));
    }
    let body = http_body_util::Limited::new(answer.into_body(), HELLO_MAX)
        .collect()
        .await
        .map_err(|_| refused("its answer is too long or broken"))?
        .to_bytes();
    let v: Value = serde_json::from_slice(&body).map_err(|_| refused("its answer is not JSON"))?;
    let (Some(id), Some(url), Some(given)) = (
        v["instance"].as_str(),
        v["url"].as_str(),
        v["proof"].as_str(),
    ) else {
        return Err(refused("its answer is not a proof"));
    };
    if url != base {
        return Err(refused(
            "it is advertised at another URL (an answer relayed from elsewhere)",
        ));
    }
    let ok: bool = proof(secret, &nonce, id, base)
        .as_bytes()
        .ct_eq(given.as_bytes())
        .into();
    if !ok || !engine::bounded::is_bounded(id) {
        return Err(refused(
            "wrong proof (another cluster secret, or not an instance)",
        ));
    }
    Ok(id.to_owned())
}

/// The answer of `GET /cluster/v1/hello?nonce=…` for an instance `me` advertised at `url`, with
/// `secret`; `None` for a nonce that is not 32 to 128 hex digits.
pub fn hello_answer(secret: &[u8], me: &str, url: &str, nonce: &str) -> Option<Value> {
    let ok = NONCE.contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| json!({"instance": me, "url": url, "proof": proof(secret, nonce, me, url)}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_proves_the_secret_the_instance_and_its_url() {
        let (k, url) = (b"s3cret-s3cret-s3cret-s3cret-1234", "http://10.0.0.5:8000/");
        let nonce = "ab".repeat(16);
        let a = hello_answer(k, "inst-1", url, &nonce).unwrap();
        assert_eq!(
            (a["instance"].as_str(), a["url"].as_str()),
            (Some("inst-1"), Some(url))
        );
        let p = a["proof"].as_str().unwrap();
        assert_eq!(p, proof(k, &nonce, "inst-1", url));
        assert_ne!(
            p,
            proof(b"another-secret-another-secret-12", &nonce, "inst-1", url)
        );
        assert_ne!(p, proof(k, &nonce, "inst-2", url));
        // Relayed from an instance advertised elsewhere: another proof.
        assert_ne!(p, proof(k, &nonce, "inst-1", "http://evil:8000/"));
        for bad in ["", "abc", &"g".repeat(32), &"a".repeat(129)] {
            assert!(hello_answer(b"k", "i", url, bad).is_none(), "{bad:?}");
        }
    }
}
