//! A listener's pair: read, refused when it cannot be used, served again once it changes.

use super::*;
use testkit::tls::Ca;

fn write(dir: &Path, names: &[&str], ca: &Ca) -> (PathBuf, PathBuf) {
    let (cert, key) = ca.issue(names);
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, key).unwrap();
    (c, k)
}

fn served(r: &Reloading) -> Vec<u8> {
    r.current.read().unwrap().cert[0].to_vec()
}

#[test]
fn a_pair_is_read_again_when_it_changes_and_kept_when_it_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let (c, k) = write(dir.path(), &["localhost"], &ca);
    let r = Reloading::load(&c, &k).unwrap();
    let first = served(&r);
    assert!(!r.reload(false), "nothing changed");
    // A new pair (the files' times move on): served.
    std::thread::sleep(Duration::from_millis(20));
    write(dir.path(), &["localhost", "127.0.0.1"], &ca);
    let later = SystemTime::now() + Duration::from_secs(1);
    for p in [&c, &k] {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(later)
            .unwrap();
    }
    assert!(r.reload(false));
    assert_ne!(served(&r), first);
    // A broken pair keeps the one served.
    let second = served(&r);
    std::fs::write(&k, "not a key").unwrap();
    assert!(!r.reload(true));
    assert_eq!(served(&r), second);
}

#[test]
fn a_pair_that_cannot_be_used_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let (c, k) = write(dir.path(), &["localhost"], &ca);
    let missing = dir.path().join("missing.pem");
    let e = Reloading::load(&missing, &k).unwrap_err();
    assert!(e.contains("missing.pem"), "{e}");
    // Another pair's key.
    let other = tempfile::tempdir().unwrap();
    let (_, k2) = write(other.path(), &["localhost"], &ca);
    let e = Reloading::load(&c, &k2).unwrap_err();
    assert!(e.contains("does not match"), "{e}");
    std::fs::write(&c, "").unwrap();
    let e = Reloading::load(&c, &k).unwrap_err();
    assert!(e.contains("no certificate"), "{e}");
    assert!(roots(Some(&c), "--cluster-ca").is_err());
}
