//! Time: the clock the run core reads (injected, so expiry is tested without waiting) and the one
//! timestamp format the gateway writes (RFC 3339, UTC, milliseconds, `Z`), through `time`.

use std::sync::atomic::{AtomicI64, Ordering};

use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::OffsetDateTime;

/// Time source, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that can be moved forward (tests).
#[derive(Default)]
pub struct OffsetClock {
    pub offset_ms: AtomicI64,
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.offset_ms.load(Ordering::SeqCst)
    }
}

/// RFC 3339 UTC with millisecond precision and `Z` (`2026-12-02T05:49:23.123Z`). Instants outside
/// the years 0000–9999 are clamped to them (no timestamp the gateway makes is near either).
pub fn rfc3339_ms(ms: i64) -> String {
    const MIN: i64 = -62_167_219_200_000; // 0000-01-01T00:00:00.000Z
    const MAX: i64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    let ms = ms.clamp(MIN, MAX);
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .expect("clamped to the representable years");
    at.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .expect("a date within 0000-9999 formats")
}

/// Parses an RFC 3339 timestamp (any offset, any fraction; as [`rfc3339_ms`] writes them and as
/// other writers of a state file may) to milliseconds since the epoch. `None` for anything that is
/// not a valid date and time (month 13, day 40, no offset…).
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let at = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_764_654_563_123), "2025-12-02T05:49:23.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_795_980_985_782), "2026-11-29T19:36:25.782Z");
        assert_eq!(rfc3339_ms(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(i64::MIN), "0000-01-01T00:00:00.000Z");
    }

    #[test]
    fn parses_what_it_formats_and_other_offsets() {
        for ms in [
            0,
            1,
            999,
            1_764_654_563_123,
            -1,
            951_782_400_123,
            4_102_444_800_999,
        ] {
            assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms), "{ms}");
        }
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00.5+01:00"), Some(500));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.123456Z"), Some(123));
    }

    #[test]
    fn refuses_dates_that_do_not_exist() {
        for bad in [
            "2026-13-01T00:00:00.000Z",
            "2026-01-40T00:00:00.000Z",
            "2026-02-30T00:00:00.000Z",
            "2026-01-01T24:00:00.000Z",
            "2026-01-01T00:00:00.000",
            "2026-01-01",
            "",
            "not a date",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
