//! The latest user message → A2A parts, validated before the SSE response starts.
//!
//! Text parts pass through; images must be inline base64 data of an allowed type, within the size
//! limits and the pixel cap their header declares. These checks are cheap and come first; the
//! images are decoded and normalised ([`super::images`]) only later, once the request would be
//! admitted ([`UserMessage::decode_images`]), so a request refused for anything else costs no
//! decode.

use base64::Engine as _;
use serde_json::{json, Value};

pub use super::images::{normalise_image, pixels, MAX_PIXELS, MAX_SIDE, TARGET_BYTES};
use crate::error::{msg, ApiError, Code};

/// Size limits of images (decoded bytes).
#[derive(Debug, Clone, Copy)]
pub struct ImageLimits {
    pub per_image: usize,
    pub total: usize,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            per_image: 8 * 1024 * 1024,
            total: 10 * 1024 * 1024,
        }
    }
}

/// The message id and A2A parts of the latest user message.
#[derive(Debug, Clone, PartialEq)]
pub struct UserMessage {
    pub message_id: String,
    /// Its parts; images join them when decoded ([`UserMessage::decode_images`]).
    pub parts: Vec<a2a::Part>,
    /// Images that passed the cheap checks and wait to be decoded, in order.
    images: Vec<RawImage>,
}

/// An image checked (type, size, declared pixels) but not decoded yet.
#[derive(Clone, PartialEq)]
struct RawImage {
    /// Its index among the message's parts once every image is in.
    at: usize,
    filename: String,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for RawImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawImage")
            .field("at", &self.at)
            .field("filename", &self.filename)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl UserMessage {
    /// The images still to decode.
    pub fn images_to_decode(&self) -> usize {
        self.images.len()
    }

    /// Decodes and normalises the images, each into its place among the parts; an image that
    /// does not decode refuses the request. CPU work of up to a second an image: run it off the
    /// async runtime, under the decode gate.
    pub fn decode_images(&mut self) -> Result<(), ApiError> {
        for image in std::mem::take(&mut self.images) {
            let (normalised, media_type) =
                normalise_image(&image.bytes).ok_or_else(|| err(msg::IMAGE_INVALID))?;
            let part = a2a::Part::Data {
                data: json!({
                    "filename": image.filename,
                    "bytes": base64::engine::general_purpose::STANDARD.encode(&normalised),
                }),
                media_type: media_type.to_owned(),
            };
            // In order of `at`: the parts before each image are in place when it goes in.
            self.parts.insert(image.at.min(self.parts.len()), part);
        }
        Ok(())
    }
}

fn err(m: &'static str) -> ApiError {
    ApiError::new(Code::InvalidInput, m)
}

/// Selects the latest user message and converts it.
pub fn latest_user_message(
    messages: &[Value],
    limits: ImageLimits,
) -> Result<UserMessage, ApiError> {
    let m = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .ok_or_else(|| err(msg::NO_USER_MESSAGE))?;
    let message_id = m
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    // The one message id the gateway keeps and sends on: bounded as the other ids (those of the
    // history are read past and dropped).
    if !super::is_bounded(&message_id) {
        return Err(err(msg::ID_MESSAGE));
    }
    let (parts, images) = match m.get("content") {
        Some(Value::String(s)) => (vec![a2a::Part::text(s.as_str())], Vec::new()),
        Some(Value::Array(items)) => convert_parts(items, limits)?,
        _ => return Err(err(msg::CONTENT_INVALID)),
    };
    Ok(UserMessage {
        message_id,
        parts,
        images,
    })
}

/// The text parts, and the images checked but not decoded.
fn convert_parts(
    items: &[Value],
    limits: ImageLimits,
) -> Result<(Vec<a2a::Part>, Vec<RawImage>), ApiError> {
    let mut out = Vec::with_capacity(items.len());
    let mut images = Vec::new();
    let mut total = 0usize;
    for item in items {
        match item.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = item.get("text").and_then(Value::as_str).unwrap_or_default();
                out.push(a2a::Part::text(t));
            }
            Some("image") => {
                let source = item.get("source").cloned().unwrap_or(Value::Null);
                // Never fetched: a URL would make the gateway a request forger, and a provider
                // file handle means nothing to the kernel.
                match source.get("type").and_then(Value::as_str) {
                    Some("data") => {}
                    Some("file") => return Err(err(msg::FILE_SOURCE)),
                    _ => return Err(err(msg::REMOTE_MEDIA)),
                }
                let mime = source
                    .get("mimeType")
                    .or_else(|| source.get("mime_type"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                if !matches!(
                    mime.as_str(),
                    "image/png" | "image/jpeg" | "image/gif" | "image/webp"
                ) {
                    return Err(err(msg::IMAGE_MIME));
                }
                let data = source
                    .get("value")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let bytes = decode_base64(data).ok_or_else(|| err(msg::IMAGE_BASE64))?;
                if bytes.len() > limits.per_image {
                    return Err(err(msg::IMAGE_TOO_LARGE));
                }
                total += bytes.len();
                if total > limits.total {
                    return Err(err(msg::IMAGES_TOO_LARGE));
                }
                if bytes.is_empty() {
                    return Err(err(msg::IMAGE_INVALID));
                }
                if pixels(&bytes).is_some_and(|p| p > MAX_PIXELS) {
                    return Err(err(msg::IMAGE_TOO_MANY_PIXELS));
                }
                let at = out.len() + images.len();
                let filename = item
                    .get("metadata")
                    .and_then(Value::as_object)
                    .and_then(|m| m.get("filename"))
                    .and_then(Value::as_str)
                    .filter(|f| f.len() <= 255 && is_safe_filename(f))
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("agui-image-{}", at + 1));
                images.push(RawImage {
                    at,
                    filename,
                    bytes,
                });
            }
            Some("audio") => return Err(err(msg::AUDIO_UNSUPPORTED)),
            Some("video") => return Err(err(msg::VIDEO_UNSUPPORTED)),
            Some("document") => return Err(err(msg::DOCUMENT_UNSUPPORTED)),
            // The deprecated `binary` part stays unsupported, as the protocol reference says (the
            // 1.0 client rewrites binary images to image parts before sending them).
            _ => return Err(err(msg::ONLY_TEXT_AND_IMAGES)),
        }
    }
    Ok((out, images))
}

/// Strict standard base64: padding required, no whitespace; non-zero trailing bits accepted.
pub fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{
        general_purpose::GeneralPurpose, DecodePaddingMode, GeneralPurposeConfig,
    };
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
            .with_decode_allow_trailing_bits(true),
    );
    if !s.is_ascii() {
        return None;
    }
    ENGINE.decode(s).ok()
}

/// A "safe artifact filename": sanitising it would not change it.
pub fn is_safe_filename(name: &str) -> bool {
    if name.is_empty() || name == "." || name == ".." {
        return false;
    }
    if name.ends_with(' ') || name.ends_with('.') {
        return false;
    }
    if name.chars().any(|c| {
        (c as u32) < 0x20 || matches!(c, '<' | '>' | ':' | '"' | '/' | '\\' | '|' | '?' | '*')
    }) {
        return false;
    }
    let b = name.as_bytes();
    if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
        return false;
    }
    let stem: String = name
        .split('.')
        .next()
        .unwrap_or("")
        .chars()
        .map(|c| match c {
            '¹' => '1',
            '²' => '2',
            '³' => '3',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    !store::is_reserved_windows_name(&stem)
}

#[cfg(test)]
mod tests {
    use super::super::images::testing::png;
    use super::*;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn msg_with(parts: Value) -> Vec<Value> {
        vec![json!({"id":"u1","role":"user","content":parts})]
    }

    #[test]
    fn selects_latest_user_message() {
        let m = vec![
            json!({"id":"u1","role":"user","content":"first"}),
            json!({"id":"u2","role":"user","content":"second"}),
            json!({"id":"a1","role":"assistant","content":"x"}),
        ];
        let u = latest_user_message(&m, ImageLimits::default()).unwrap();
        assert_eq!(u.message_id, "u2");
        assert_eq!(u.parts, vec![a2a::Part::text("second")]);
        let none = vec![json!({"id":"a1","role":"assistant","content":"x"})];
        assert_eq!(
            latest_user_message(&none, ImageLimits::default())
                .unwrap_err()
                .message,
            msg::NO_USER_MESSAGE
        );
        let empty = latest_user_message(&msg_with(json!([])), ImageLimits::default()).unwrap();
        assert!(empty.parts.is_empty());
    }

    /// The latest user message's id is bounded; the history's ids are not read.
    #[test]
    fn the_kept_message_id_is_bounded() {
        for bad in ["x".repeat(257), "m\u{0}".into()] {
            let m = vec![json!({"id": bad, "role": "user", "content": "hi"})];
            let e = latest_user_message(&m, ImageLimits::default()).unwrap_err();
            assert_eq!((e.code, &*e.message), (Code::InvalidInput, msg::ID_MESSAGE));
        }
        let m = vec![
            json!({"id": "x".repeat(300), "role": "user", "content": "old"}),
            json!({"id": "é".repeat(128), "role": "user", "content": "hi"}),
        ];
        assert_eq!(
            latest_user_message(&m, ImageLimits::default())
                .unwrap()
                .message_id,
            "é".repeat(128)
        );
    }

    /// The message with its images decoded, as an admitted run has it.
    fn decoded(messages: &[Value], limits: ImageLimits) -> Result<UserMessage, ApiError> {
        let mut u = latest_user_message(messages, limits)?;
        u.decode_images()?;
        Ok(u)
    }

    #[test]
    fn images_are_checked_first_and_decoded_in_their_place() {
        let p = png(4, 4, false);
        let m = msg_with(
            json!([{"type":"image","source":{"type":"data","value":b64(&p),"mimeType":"image/png"}},
            {"type":"text","text":"between"},
            {"type":"image","source":{"type":"data","value":b64(b"not an image"),"mimeType":"image/png"}}]),
        );
        // The checks pass without decoding: only the text is in, both images wait.
        let mut u = latest_user_message(&m, ImageLimits::default()).unwrap();
        assert_eq!(u.parts, vec![a2a::Part::text("between")]);
        assert_eq!(u.images_to_decode(), 2);
        // The one that does not decode refuses the request when decoded.
        assert_eq!(u.decode_images().unwrap_err().message, msg::IMAGE_INVALID);
        let m = msg_with(
            json!([{"type":"image","source":{"type":"data","value":b64(&p),"mimeType":"image/png"}},
            {"type":"text","text":"between"},
            {"type":"image","source":{"type":"data","value":b64(&p),"mimeType":"image/png"}}]),
        );
        let u = decoded(&m, ImageLimits::default()).unwrap();
        assert_eq!(u.images_to_decode(), 0);
        let parts = serde_json::to_value(&u.parts).unwrap();
        assert_eq!(parts[0]["data"]["filename"], "agui-image-1");
        assert_eq!(parts[1], json!({"text":"between"}));
        assert_eq!(parts[2]["data"]["filename"], "agui-image-3");
    }

    #[test]
    fn images_are_converted_and_named() {
        let p = png(4, 4, false);
        let u = decoded(
            &msg_with(json!([{"type":"text","text":"see"},
                {"type":"image","source":{"type":"data","value":b64(&p),"mimeType":"image/PNG"},"metadata":{"filename":"pic.png"}},
                {"type":"image","source":{"type":"data","value":b64(&p),"mimeType":"image/jpeg"},"metadata":{"filename":"a/b.png"}}])),
            ImageLimits::default(),
        )
        .unwrap();
        let parts = serde_json::to_value(&u.parts).unwrap();
        assert_eq!(parts[0], json!({"text":"see"}));
        assert_eq!(parts[1]["data"]["filename"], "pic.png");
        assert_eq!(parts[1]["mediaType"], "image/png");
        assert_eq!(parts[1]["data"]["bytes"], b64(&p));
        assert_eq!(parts[2]["data"]["filename"], "agui-image-3");
        assert_eq!(parts[2]["mediaType"], "image/png");
    }

    /// A PNG of a few hundred bytes that declares `w` × `h` pixels: a valid header, one compressed
    /// empty row (the rest is missing, so it would fail late, after the allocation).
    fn declared_png(w: u32, h: u32) -> Vec<u8> {
        fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let mut c = kind.to_vec();
            c.extend_from_slice(data);
            out.extend_from_slice(&c);
            out.extend_from_slice(&crc32fast::hash(&c).to_be_bytes());
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&w.to_be_bytes());
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(
            &mut png,
            b"IDAT",
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        );
        chunk(&mut png, b"IEND", &[]);
        png
    }

    #[test]
    fn an_image_declaring_too_many_pixels_is_refused_before_decoding() {
        let bomb = declared_png(20_000, 20_000);
        assert!(bomb.len() < 200);
        assert_eq!(pixels(&bomb), Some(400_000_000));
        let started = std::time::Instant::now();
        let m = msg_with(json!([{"type": "image", "source": {"type": "data",
            "mimeType": "image/png", "value": b64(&bomb)}}]));
        let e = latest_user_message(&m, ImageLimits::default()).unwrap_err();
        assert_eq!(e.message, msg::IMAGE_TOO_MANY_PIXELS);
        assert!(normalise_image(&bomb).is_none());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // At the cap the header is read and the image judged by its data as before.
        assert_eq!(pixels(&declared_png(6_000, 6_000)), Some(MAX_PIXELS));
    }

    #[test]
    fn rejections() {
        let cases = [
            (
                json!([{"type":"image","source":{"type":"data","value":"AA==","mimeType":"image/bmp"}}]),
                msg::IMAGE_MIME,
            ),
            (
                json!([{"type":"image","source":{"type":"url","value":"http://x/a.png"}}]),
                msg::REMOTE_MEDIA,
            ),
            (
                json!([{"type":"audio","source":{"type":"data","value":"AA==","mimeType":"audio/wav"}}]),
                msg::AUDIO_UNSUPPORTED,
            ),
            (
                json!([{"type":"video","source":{"type":"url","value":"http://x/v.mp4"}}]),
                msg::VIDEO_UNSUPPORTED,
            ),
            (
                json!([{"type":"document","source":{"type":"file","value":"file-123","provider":"openai"}}]),
                msg::DOCUMENT_UNSUPPORTED,
            ),
            (
                json!([{"type":"image","source":{"type":"file","value":"file-123","mimeType":"image/png"}}]),
                msg::FILE_SOURCE,
            ),
            (
                json!([{"type":"binary","mimeType":"image/png","data":"AA=="}]),
                msg::ONLY_TEXT_AND_IMAGES,
            ),
            (
                json!([{"type":"image","source":{"type":"data","value":"abc$","mimeType":"image/png"}}]),
                msg::IMAGE_BASE64,
            ),
            (
                json!([{"type":"image","source":{"type":"data","value":"YQ","mimeType":"image/png"}}]),
                msg::IMAGE_BASE64,
            ),
            (
                json!([{"type":"image","source":{"type":"data","value":"YQ==\n","mimeType":"image/png"}}]),
                msg::IMAGE_BASE64,
            ),
            (
                json!([{"type":"image","source":{"type":"data","value":b64(b"hello"),"mimeType":"image/png"}}]),
                msg::IMAGE_INVALID,
            ),
            (
                json!([{"type":"image","source":{"type":"data","value":"","mimeType":"image/png"}}]),
                msg::IMAGE_INVALID,
            ),
        ];
        for (parts, expected) in cases {
            let e = decoded(&msg_with(parts.clone()), ImageLimits::default()).unwrap_err();
            assert_eq!(e.message, expected, "{parts}");
            assert_eq!(e.code, Code::InvalidInput);
        }
        // Non-zero trailing bits are accepted ("YR==" decodes to "a").
        assert_eq!(decode_base64("YR==").unwrap(), b"a");
    }

    #[test]
    fn size_limits() {
        let p = png(4, 4, false);
        let lim = ImageLimits {
            per_image: p.len() - 1,
            total: 1 << 30,
        };
        let one = json!([{"type":"image","source":{"type":"data","value":b64(&p),"mimeType":"image/png"}}]);
        assert_eq!(
            latest_user_message(&msg_with(one.clone()), lim)
                .unwrap_err()
                .message,
            msg::IMAGE_TOO_LARGE
        );
        let lim = ImageLimits {
            per_image: p.len(),
            total: p.len() * 2 - 1,
        };
        let two = json!([one[0].clone(), one[0].clone()]);
        assert_eq!(
            latest_user_message(&msg_with(two), lim)
                .unwrap_err()
                .message,
            msg::IMAGES_TOO_LARGE
        );
    }

    #[test]
    fn filenames() {
        for ok in ["pic.png", "a b.jpg", ".hidden", "com0.png", "résumé.png"] {
            assert!(is_safe_filename(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\\b",
            "C:x",
            "CON.png",
            "con",
            "lpt1.txt",
            "COM¹.png",
            "a.",
            "a ",
            "x?y",
            "t\u{1}",
        ] {
            assert!(!is_safe_filename(bad), "{bad}");
        }
    }
}
