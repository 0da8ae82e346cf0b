//! The latest user message → A2A parts, validated before the SSE response starts.
//!
//! Text parts pass through; images must be inline base64 data of an allowed type, within the size
//! limits and decodable. Images are normalised (≤ 2000×2000 px, ≤ 3,932,160 bytes, PNG/JPEG/GIF/WEBP
//! kept, others re-encoded as PNG, JPEG fallback). This is CPU work: call it off the async runtime.

use std::io::Cursor;

use base64::Engine as _;
use image::{DynamicImage, GenericImageView, ImageFormat};
use serde_json::{json, Value};

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

/// Target of normalisation: 5 MiB × 3/4 of raw bytes, 2000×2000 px.
pub const TARGET_BYTES: usize = 3_932_160;
pub const MAX_SIDE: u32 = 2000;

/// The message id and A2A parts of the latest user message.
#[derive(Debug, Clone, PartialEq)]
pub struct UserMessage {
    pub message_id: String,
    pub parts: Vec<a2a::Part>,
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
    let parts = match m.get("content") {
        Some(Value::String(s)) => vec![a2a::Part::text(s.as_str())],
        Some(Value::Array(items)) => convert_parts(items, limits)?,
        _ => return Err(err(msg::CONTENT_INVALID)),
    };
    Ok(UserMessage { message_id, parts })
}

fn convert_parts(items: &[Value], limits: ImageLimits) -> Result<Vec<a2a::Part>, ApiError> {
    let mut out = Vec::with_capacity(items.len());
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
                if pixels(&bytes).is_some_and(|p| p > MAX_PIXELS) {
                    return Err(err(msg::IMAGE_TOO_MANY_PIXELS));
                }
                let (normalised, media_type) =
                    normalise_image(&bytes).ok_or_else(|| err(msg::IMAGE_INVALID))?;
                let filename = item
                    .get("metadata")
                    .and_then(Value::as_object)
                    .and_then(|m| m.get("filename"))
                    .and_then(Value::as_str)
                    .filter(|f| f.len() <= 255 && is_safe_filename(f))
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("agui-image-{}", out.len() + 1));
                out.push(a2a::Part::Data {
                    data: json!({
                        "filename": filename,
                        "bytes": base64::engine::general_purpose::STANDARD.encode(&normalised),
                    }),
                    media_type: media_type.to_owned(),
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
    Ok(out)
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
    !is_reserved_windows_name(&stem)
}

/// CON, PRN, AUX, NUL, COM1–9, LPT1–9.
pub fn is_reserved_windows_name(upper: &str) -> bool {
    if matches!(upper, "CON" | "PRN" | "AUX" | "NUL") {
        return true;
    }
    let b = upper.as_bytes();
    b.len() == 4
        && (upper.starts_with("COM") || upper.starts_with("LPT"))
        && (b'1'..=b'9').contains(&b[3])
}

fn limits() -> image::Limits {
    let mut l = image::Limits::default();
    // Decompression-bomb guard.
    l.max_image_width = Some(20_000);
    l.max_image_height = Some(20_000);
    l.max_alloc = Some(512 * 1024 * 1024);
    l
}

/// The most pixels an image may declare: it is decoded whole before it is scaled down, so its
/// declared size, not its compressed bytes, is what it costs (a 100 KB PNG can declare
/// 20,000 × 20,000). 36 megapixels: a 6,000 × 6,000 photograph, about 140 MB decoded as RGBA.
pub const MAX_PIXELS: u64 = 36_000_000;

/// The pixels an image declares in its header, read without decoding it (`None`: no header that
/// tells).
pub fn pixels(bytes: &[u8]) -> Option<u64> {
    let (w, h) = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?
        .into_dimensions()
        .ok()?;
    Some(u64::from(w) * u64::from(h))
}

fn decode(bytes: &[u8]) -> Option<(ImageFormat, DynamicImage)> {
    if pixels(bytes).is_some_and(|p| p > MAX_PIXELS) {
        return None;
    }
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?;
    reader.limits(limits());
    let format = reader.format()?;
    let img = reader.decode().ok()?;
    Some((format, img))
}

fn encode(img: &DynamicImage, format: ImageFormat) -> Option<Vec<u8>> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).ok()?;
    Some(out.into_inner())
}

fn encode_jpeg(img: &DynamicImage, quality: u8) -> Option<Vec<u8>> {
    let rgb = DynamicImage::ImageRgb8(img.to_rgb8());
    let mut out = Vec::new();
    let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality);
    rgb.write_with_encoder(enc).ok()?;
    Some(out)
}

fn fit(img: &DynamicImage, side: u32) -> DynamicImage {
    let (w, h) = img.dimensions();
    if w <= side && h <= side {
        return img.clone();
    }
    img.resize(side, side, image::imageops::FilterType::Lanczos3)
}

/// Normalises an image; returns the bytes to send and their media type, `None` when invalid.
pub fn normalise_image(bytes: &[u8]) -> Option<(Vec<u8>, &'static str)> {
    if bytes.is_empty() {
        return None;
    }
    let (format, img) = decode(bytes)?;
    let (mut bytes, mut format) = match format {
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::Gif | ImageFormat::WebP => {
            (bytes.to_vec(), format)
        }
        _ => (encode(&img, ImageFormat::Png)?, ImageFormat::Png),
    };
    let (w, h) = img.dimensions();
    if bytes.len() <= TARGET_BYTES && w <= MAX_SIDE && h <= MAX_SIDE {
        return Some((bytes, mime(format)));
    }
    let scaled = fit(&img, MAX_SIDE);
    if format == ImageFormat::Png {
        if let Some(png) = encode(&scaled, ImageFormat::Png) {
            if png.len() <= TARGET_BYTES {
                return Some((png, "image/png"));
            }
        }
    }
    for q in [80u8, 60, 40, 20] {
        let jpg = encode_jpeg(&scaled, q)?;
        if jpg.len() <= TARGET_BYTES {
            bytes = jpg;
            format = ImageFormat::Jpeg;
            return Some((bytes, mime(format)));
        }
    }
    let small = fit(&img, 1000);
    let jpg = encode_jpeg(&small, 20)?;
    (jpg.len() <= TARGET_BYTES).then_some((jpg, "image/jpeg"))
}

fn mime(f: ImageFormat) -> &'static str {
    match f {
        ImageFormat::Png => "image/png",
        ImageFormat::Jpeg => "image/jpeg",
        ImageFormat::Gif => "image/gif",
        ImageFormat::WebP => "image/webp",
        _ => "image/png",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32, noise: bool) -> Vec<u8> {
        let mut img = image::RgbImage::new(w, h);
        let mut x: u32 = 12345;
        for p in img.pixels_mut() {
            if noise {
                x = x.wrapping_mul(1103515245).wrapping_add(12345);
                *p = image::Rgb([(x >> 16) as u8, (x >> 8) as u8, x as u8]);
            } else {
                *p = image::Rgb([200, 10, 10]);
            }
        }
        encode(&DynamicImage::ImageRgb8(img), ImageFormat::Png).unwrap()
    }

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

    #[test]
    fn images_are_converted_and_named() {
        let p = png(4, 4, false);
        let u = latest_user_message(
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
    fn bmp_is_reencoded_as_png() {
        let mut bmp = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(image::RgbImage::new(3, 3))
            .write_to(&mut bmp, ImageFormat::Bmp)
            .unwrap();
        let (bytes, mt) = normalise_image(bmp.get_ref()).unwrap();
        assert_eq!(mt, "image/png");
        assert_eq!(image::guess_format(&bytes).unwrap(), ImageFormat::Png);
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
            let e =
                latest_user_message(&msg_with(parts.clone()), ImageLimits::default()).unwrap_err();
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
    fn large_images_are_downscaled_within_bounds() {
        let p = png(3000, 1500, true);
        assert!(p.len() > TARGET_BYTES);
        let (bytes, mt) = normalise_image(&p).unwrap();
        assert!(bytes.len() <= TARGET_BYTES);
        let (_, img) = decode(&bytes).unwrap();
        let (w, h) = img.dimensions();
        assert!(w <= MAX_SIDE && h <= MAX_SIDE, "{w}x{h}");
        assert!(mt == "image/png" || mt == "image/jpeg");
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
