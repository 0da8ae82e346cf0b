//! Who is calling: verified identities. `jwt` checks a bearer JWT against a key set (RS256,
//! ES256, EdDSA; never `none`, never an HMAC secret) and names its user; `keys` holds the key
//! set; `source` reads it from a file and again on an unknown key id or a timer, so a key
//! rotation needs no restart. No route uses them yet: the service
//! token (`--auth-token`) is still the only authentication.

pub mod jwt;
pub mod keys;
pub mod source;
