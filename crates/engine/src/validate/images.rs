//! Images: what their header declares (read without decoding) and their normalisation (decoded
//! whole, scaled down to ≤ 2000×2000 px and ≤ 3,932,160 bytes; PNG/JPEG/GIF/WEBP kept, others
//! re-encoded as PNG, JPEG as the fallback). Normalising is CPU work of up to about a second and
//! 150 MB: it runs off the async runtime, under the gate that bounds how many run at once
//! (`run::prepare`), and only for requests that passed every cheap check.

use std::io::Cursor;

use image::{DynamicImage, GenericImageView, ImageFormat};

/// Target of normalisation: 5 MiB × 3/4 of raw bytes, 2000×2000 px.
pub const TARGET_BYTES: usize = 3_932_160;
pub const MAX_SIDE: u32 = 2000;

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
pub(crate) mod testing {
    use super::*;

    /// A `w` × `h` PNG, one colour or noise (which compresses badly).
    pub fn png(w: u32, h: u32, noise: bool) -> Vec<u8> {
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
}

#[cfg(test)]
mod tests {
    use super::testing::png;
    use super::*;

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
}
