//! Timestamps as request logs write them, read into epoch milliseconds (UTC):
//! RFC 3339 (`2026-11-20T10:00:00.250Z`), the Common Log Format's
//! `20/Nov/2026:10:00:00 +0000`, and plain epoch numbers.

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Count from March, so that the leap day is the last day of a "year" and
    // every year before it has the same month lengths.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (i64::from(month) + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Epoch milliseconds of a UTC wall-clock time, minus `offset_s` (the
/// zone's offset east of UTC); `None` for an impossible date or a time
/// before 1970.
fn epoch_ms(
    date: (i64, u32, u32),
    time: (u32, u32, u32),
    millis: u32,
    offset_s: i64,
) -> Option<u64> {
    let (year, month, day) = date;
    let (hour, minute, second) = time;
    // 60: a leap second, which logs do write; it reads as the next second.
    let valid = (1..=12).contains(&month)
        && day >= 1
        && day <= days_in_month(year, month)
        && hour < 24
        && minute < 60
        && second <= 60;
    if !valid {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400
        + i64::from(hour * 3600 + minute * 60 + second)
        - offset_s;
    u64::try_from(seconds * 1000 + i64::from(millis)).ok()
}

fn number<T: std::str::FromStr>(text: &str, digits: usize) -> Option<T> {
    (text.len() == digits && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// `+hh:mm`, `-hhmm` or `Z` as seconds east of UTC.
fn zone_offset(zone: &str) -> Option<i64> {
    if zone.eq_ignore_ascii_case("z") {
        return Some(0);
    }
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits = zone[1..].replace(':', "");
    let hours: i64 = number(digits.get(..2)?, 2)?;
    let minutes: i64 = number(digits.get(2..)?, 2)?;
    (minutes < 60).then_some(sign * (hours * 3600 + minutes * 60))
}

/// Fractional seconds (`.250`, `.123456789`) as whole milliseconds,
/// truncated: a log's clock is read as it ticked, never ahead of it.
fn fraction_ms(digits: &str) -> Option<u32> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let three: String = digits.chars().chain("000".chars()).take(3).collect();
    three.parse().ok()
}

/// An RFC 3339 timestamp (`2026-11-20T10:00:00Z`, `...T10:00:00.250+01:00`;
/// a space may stand for the `T`) as epoch milliseconds.
pub fn rfc3339_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.len() < 20 || !text.is_ascii() {
        return None;
    }
    let (date, rest) = text.split_at(10);
    let sep = rest.as_bytes()[0];
    if !matches!(sep, b'T' | b't' | b' ')
        || date.as_bytes()[4] != b'-'
        || date.as_bytes()[7] != b'-'
    {
        return None;
    }
    let year = number(&date[..4], 4)?;
    let month = number(&date[5..7], 2)?;
    let day = number(&date[8..10], 2)?;
    let clock = &rest[1..];
    let (hms, rest) = clock.split_at(8.min(clock.len()));
    let parts: Vec<&str> = hms.split(':').collect();
    let [h, m, s] = parts[..] else { return None };
    let (millis, zone) = match rest.strip_prefix('.') {
        Some(frac) => {
            let end = frac
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(frac.len());
            (fraction_ms(&frac[..end])?, &frac[end..])
        }
        None => (0, rest),
    };
    epoch_ms(
        (year, month, day),
        (number(h, 2)?, number(m, 2)?, number(s, 2)?),
        millis,
        zone_offset(zone)?,
    )
}

/// The Common Log Format's time, without its brackets:
/// `20/Nov/2026:10:00:00 +0000`, to the second (what the format keeps).
pub fn clf_ms(text: &str) -> Option<u64> {
    let (stamp, zone) = text.trim().split_once(' ')?;
    let mut parts = stamp.splitn(4, [':', '/']);
    let day = number(parts.next()?, 2)?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year = number(parts.next()?, 4)?;
    let clock: Vec<&str> = parts.next()?.split(':').collect();
    let [h, m, s] = clock[..] else { return None };
    epoch_ms(
        (year, month, day),
        (number(h, 2)?, number(m, 2)?, number(s, 2)?),
        0,
        zone_offset(zone)?,
    )
}

/// An epoch number in whatever unit its size gives away: seconds,
/// milliseconds, microseconds or nanoseconds (Logpush writes any of them,
/// as configured). Epoch milliseconds from 2001 to 2286 have 13 digits.
pub fn epoch_any_ms(value: f64) -> Option<u64> {
    if !value.is_finite() || value < 0.0 || value >= u64::MAX as f64 {
        return None;
    }
    if value >= 1e11 {
        // Whole units finer than a second: integer division, no rounding.
        return Some(epoch_int_ms(value as u64));
    }
    Some((value * 1e3).floor() as u64)
}

/// [`epoch_any_ms`] of a whole number, exact however large.
pub fn epoch_int_ms(value: u64) -> u64 {
    match value {
        v if v >= 100_000_000_000_000_000 => v / 1_000_000,
        v if v >= 100_000_000_000_000 => v / 1_000,
        v if v >= 100_000_000_000 => v,
        v => v * 1000,
    }
}

/// Epoch milliseconds as RFC 3339 in UTC, to the millisecond, for reports.
pub fn format_ms(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let in_day = ms % 86_400_000;
    // Inverse of days_from_civil, by the same March-based eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    if milli == 0 {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_in_every_spelling_logs_use() {
        // 2026-11-20T10:00:00Z, worked out by hand: 20 777 days after 1970-01-01.
        let base = 20_777 * 86_400_000;
        for (text, ms) in [
            ("2026-11-20T10:00:00Z", base + 36_000_000),
            ("2026-11-20T10:00:00.250Z", base + 36_000_250),
            ("2026-11-20T10:00:00.2Z", base + 36_000_200),
            ("2026-11-20T10:00:00.123456789Z", base + 36_000_123),
            ("2026-11-20T11:00:00+01:00", base + 36_000_000),
            ("2026-11-20 09:30:00-00:30", base + 36_000_000),
            ("1970-01-01T00:00:00Z", 0),
            ("2024-02-29T00:00:00Z", 1_709_164_800_000),
        ] {
            assert_eq!(rfc3339_ms(text), Some(ms), "{text}");
        }
        for bad in [
            "2026-11-20",
            "2026-11-20T10:00:00",
            "2026-13-20T10:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-20T24:00:00Z",
            "2026-11-20T10:00:00.Z",
            "1969-12-31T23:59:59Z",
            "2026-11-20T10:00:00+1:00",
            "20261120T100000Z",
            "2026-11-20T10:00:00Zjunk",
        ] {
            assert_eq!(rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn clf_times_to_the_second() {
        assert_eq!(
            clf_ms("20/Nov/2026:10:00:00 +0000"),
            rfc3339_ms("2026-11-20T10:00:00Z")
        );
        assert_eq!(
            clf_ms("10/Oct/2000:13:55:36 -0700"),
            rfc3339_ms("2000-10-10T20:55:36Z")
        );
        for bad in [
            "10/Oct/2000:13:55:36",
            "10/Okt/2000:13:55:36 -0700",
            "1/Oct/2000:13:55:36 +0000",
        ] {
            assert_eq!(clf_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn epoch_numbers_in_any_unit() {
        let ms = 1_795_168_800_250u64;
        assert_eq!(epoch_any_ms(1_795_168_800.25), Some(ms));
        assert_eq!(epoch_any_ms(ms as f64), Some(ms));
        assert_eq!(epoch_any_ms(1_795_168_800_250_000.0), Some(ms));
        assert_eq!(epoch_int_ms(1_795_168_800_250_123_456), ms);
        assert_eq!(epoch_int_ms(1_795_168_800), ms - 250);
        assert_eq!(epoch_any_ms(-1.0), None);
    }

    #[test]
    fn formatting_inverts_parsing() {
        for text in [
            "1970-01-01T00:00:00Z",
            "2000-02-29T23:59:59.999Z",
            "2026-11-20T10:00:00.250Z",
            "2100-03-01T00:00:00Z",
        ] {
            assert_eq!(format_ms(rfc3339_ms(text).unwrap()), text);
        }
    }
}
