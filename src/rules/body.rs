//! What a rule can read from a request's body: a field of a form, and
//! whether a body is JSON ([`super::json`] reads that). At most
//! [`MAX_BODY_BYTES`] are ever read; a larger body gives no value (the key
//! part is then missing, as any other). A field given twice with different
//! values gives several, which refuses the request.

use std::borrow::Cow;

use crate::rules::canon;

/// Bytes of a body the limiter reads at most, and only for rules keyed on it.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The canonical value of every field named `name` (canonical, see
/// [`canon::name`]) in a form body of this content type, as often as
/// given: urlencoded, or multipart. Any other type has no fields.
pub fn form_fields<'a, 'n>(
    body: &'a [u8],
    content_type: &str,
    name: &'n str,
) -> impl Iterator<Item = Cow<'a, str>> + use<'a, 'n> {
    let (urlencoded, multipart) = match form_kind(content_type) {
        Some(Form::Urlencoded) => (Some(canon::form_fields(body, name)), None),
        Some(Form::Multipart) => (
            None,
            boundary(content_type).map(|b| multipart_values(body, b, name)),
        ),
        None => (None, None),
    };
    let urlencoded = urlencoded.into_iter().flatten().map(canon::form_value_of);
    urlencoded.chain(multipart.into_iter().flatten())
}

/// The kinds of form [`form_fields`] reads.
enum Form {
    Urlencoded,
    Multipart,
}

/// The kind of form a body of this content type is, by its media type,
/// cut where PHP cuts it (at `;`, `,` or a space):
/// `application/x-www-form-urlencoded,` is a form to PHP.
fn form_kind(content_type: &str) -> Option<Form> {
    let media = content_type
        .trim_start()
        .split([';', ',', ' '])
        .next()
        .unwrap_or_default()
        .trim();
    if media.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Some(Form::Urlencoded)
    } else if media.eq_ignore_ascii_case("multipart/form-data") {
        Some(Form::Multipart)
    } else {
        None
    }
}

/// Whether a body of this content type is a form [`form_fields`] reads.
pub fn is_form(content_type: &str) -> bool {
    form_kind(content_type).is_some()
}

/// Whether a body of this content type is JSON to Laravel, which reads a
/// JSON body's members as form fields: a type naming `/json` or `+json`
/// anywhere, as its check does (here in any case, which can only add).
pub fn is_json(content_type: &str) -> bool {
    find_in_any_case(content_type, "/json").is_some()
        || find_in_any_case(content_type, "+json").is_some()
}

/// Where `needle` (in lower case) first occurs in `text`, in any case.
fn find_in_any_case(text: &str, needle: &str) -> Option<usize> {
    text.as_bytes()
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// The `boundary` parameter of a multipart content type, as PHP finds it:
/// after `boundary=` anywhere, to its closing quote when quoted, else to a
/// `,` or `;`. Longer than RFC 2046's 70 characters (with room to spare)
/// is no boundary: searching for one would cost its length per byte.
fn boundary(content_type: &str) -> Option<&str> {
    let at = find_in_any_case(content_type, "boundary=")? + "boundary=".len();
    let value = &content_type[at..];
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next().unwrap_or_default(),
        None => value.split([',', ';']).next().unwrap_or_default().trim(),
    };
    (!value.is_empty() && value.len() <= MAX_BOUNDARY).then_some(value)
}

/// The longest boundary read: RFC 2046 allows 70 characters.
const MAX_BOUNDARY: usize = 200;

/// Where `needle` first occurs in `haystack`, at `from` or after.
fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut at = from;
    while at < haystack.len() {
        at += haystack[at..].iter().position(|&b| b == first)?;
        if haystack[at + 1..].starts_with(rest) {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// One part of a multipart body: its head (the header lines) and content.
type Part<'a> = (&'a [u8], &'a [u8]);

/// A line of `body` from `at`: its text without the line break and the
/// spaces, tabs and carriage return before it, and where the next starts.
fn line_at(body: &[u8], at: usize) -> (&[u8], usize) {
    let end = find(body, b"\n", at).unwrap_or(body.len());
    let mut text = &body[at..end];
    while let [rest @ .., b' ' | b'\t' | b'\r'] = text {
        text = rest;
    }
    (text, (end + 1).min(body.len()))
}

/// The parts of a `multipart/form-data` body, and whether it has a closing
/// delimiter. Parsers differ on malformed bodies, so every part any of them
/// reads is read: a part starts at every line that is `--boundary` (after
/// a closing one too, as PHP goes on reading), its head ends at the first
/// empty line, and its content at the next `--boundary` that starts a line,
/// whatever follows it (PHP and busboy end a value there; a bare line feed
/// ends lines as in PHP). Values read differently then count as repeated.
fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> (Vec<Part<'a>>, bool) {
    let delimiter = format!("--{boundary}");
    let close = format!("{delimiter}--");
    let value_end = format!("\n{delimiter}");
    let (mut parts, mut closed, mut at) = (Vec::new(), false, 0);
    while at < body.len() {
        let (line, next) = line_at(body, at);
        at = next;
        if line == close.as_bytes() {
            closed = true;
            continue;
        }
        if line != delimiter.as_bytes() {
            continue;
        }
        let head = at;
        let content = loop {
            let (header, after) = line_at(body, at);
            if header.is_empty() || after == at {
                break after;
            }
            at = after;
        };
        // The value ends at the line break before the next delimiter.
        let Some(end) = find(body, value_end.as_bytes(), content.saturating_sub(1)) else {
            break;
        };
        let mut value = &body[content..end.max(content)];
        if let [rest @ .., b'\r'] = value {
            value = rest;
        }
        parts.push((&body[head..at.max(head)], value));
        at = end + 1;
    }
    (parts, closed)
}

/// Fields of a `multipart/form-data` body (RFC 7578): each part's
/// `Content-Disposition: form-data; name="..."` names it, and its content
/// runs to the line break before the next delimiter (or to a NUL in it, as
/// for every other value: [`canon::before_nul_bytes`]).
/// The part headers are read as leniently as any origin reads them: a line
/// starting with a blank or without a `:` continues the one before (PHP,
/// Go), a name may be in single quotes (PHP) or given as `name*` (RFC 2231,
/// which Go prefers).
fn multipart_values<'a>(body: &'a [u8], boundary: &str, name: &str) -> Vec<Cow<'a, str>> {
    let (parts, _) = multipart_parts(body, boundary);
    let mut values = Vec::new();
    for (head, content) in parts {
        let head = String::from_utf8_lossy(head);
        let [disposition, encoding] = part_headers(&head);
        if !disposition.is_some_and(|d| names(&d, name)) {
            continue;
        }
        values.push(String::from_utf8_lossy(canon::before_nul_bytes(content)));
        // Go decodes quoted-printable, Django base64: an encoded value is
        // read as two (a NUL no other value holds), which refuses it.
        let plain = |e: &str| {
            ["7bit", "8bit", "binary"]
                .iter()
                .any(|p| e.eq_ignore_ascii_case(p))
        };
        if encoding.is_some_and(|e| !plain(&e)) {
            values.push(Cow::Borrowed("\0"));
        }
    }
    values
}

/// The part headers a field is read by.
const PART_HEADERS: [&str; 2] = ["content-disposition", "content-transfer-encoding"];

/// The values of the first of each of [`PART_HEADERS`] in a part's `head`,
/// its name matched in any case.
fn part_headers(head: &str) -> [Option<Cow<'_, str>>; 2] {
    let mut found = [None, None];
    for line in unfolded(head) {
        let Some((name, _)) = canon::split_once_at(&line, b':') else {
            continue;
        };
        let Some(i) = PART_HEADERS
            .iter()
            .position(|n| name.trim().eq_ignore_ascii_case(n))
        else {
            continue;
        };
        if found[i].is_none() {
            found[i] = Some(match line {
                Cow::Borrowed(line) => Cow::Borrowed(after_colon(line)),
                Cow::Owned(line) => Cow::Owned(after_colon(&line).to_owned()),
            });
        }
    }
    found
}

/// A header line's value: after its first `:`, trimmed.
fn after_colon(line: &str) -> &str {
    canon::split_once_at(line, b':').map_or("", |(_, value)| value.trim())
}

/// A part's header lines, each with the lines that continue it joined to
/// it: a line starting with a blank or without a `:` continues the one
/// before (PHP, Go). Only a folded header is copied.
fn unfolded(head: &str) -> impl Iterator<Item = Cow<'_, str>> {
    let continues = |l: &str| l.starts_with([' ', '\t']) || !l.bytes().any(|b| b == b':');
    let mut lines = lines(head).peekable();
    std::iter::from_fn(move || {
        let mut line = Cow::Borrowed(lines.next()?);
        while let Some(more) = lines.next_if(|l| continues(l)) {
            if !more.is_empty() {
                line.to_mut().push_str(more);
            }
        }
        Some(line)
    })
}

/// The lines of `text` as `str::lines` gives them, found a byte at a time.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (line, next) = match canon::split_once_at(rest, b'\n') {
            Some((line, next)) => (line.strip_suffix('\r').unwrap_or(line), next),
            None => (rest, ""),
        };
        rest = next;
        Some(line)
    })
}

/// Whether a `Content-Disposition` value names the field `name`
/// (canonical), by `name=` or by `name*=`, in any case.
fn names(disposition: &str, name: &str) -> bool {
    canon::split_where(disposition, |b| b == b';')
        .skip(1)
        .any(|p| {
            let Some((key, value)) = canon::split_once_at(p, b'=') else {
                return false;
            };
            let key = key.trim();
            let value = if key.eq_ignore_ascii_case("name") {
                value.trim().trim_matches(['"', '\''])
            } else if key.eq_ignore_ascii_case("name*") {
                // `charset'language'name`, percent-encoded.
                value.rsplit_once('\'').map_or("", |(_, n)| n)
            } else {
                return false;
            };
            canon::is_name(value, name)
        })
}

/// Whether every field of a form body of this content type can be read:
/// not a multipart body without its closing delimiter (or boundary), which
/// an origin's more lenient parser may still read fields from.
pub fn fields_readable(body: &[u8], content_type: &str) -> bool {
    match form_kind(content_type) {
        Some(Form::Multipart) => boundary(content_type).is_some_and(|b| multipart_parts(body, b).1),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of a field, each once.
    fn form_values<'a>(body: &'a [u8], content_type: &str, name: &str) -> Vec<Cow<'a, str>> {
        let mut values: Vec<Cow<'a, str>> = Vec::new();
        for value in form_fields(body, content_type, name) {
            if !values.contains(&value) {
                values.push(value);
            }
        }
        values
    }

    #[test]
    fn form_fields_urlencoded_and_multipart() {
        let url = "application/x-www-form-urlencoded; charset=utf-8";
        assert_eq!(form_values(b"user=alice&x=1", url, "user"), ["alice"]);
        assert_eq!(form_values(b"User=%61lice", url, "user"), ["alice"]);
        assert_eq!(form_values(b"user=a&user=b", url, "user"), ["a", "b"]);
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nalice\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n--XyZ--\r\n";
        let multipart = "multipart/form-data; boundary=XyZ";
        assert_eq!(form_values(body, multipart, "user"), ["alice"]);
        assert_eq!(form_values(body, multipart, "file"), ["hello"]);
        let nul = b"--XyZ\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nalice\0x\r\n--XyZ\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nalice\r\n--XyZ--\r\n";
        assert_eq!(
            form_values(nul, multipart, "user"),
            ["alice"],
            "cut at NUL, then one value"
        );
        assert!(form_values(body, multipart, "none").is_empty());
        assert!(form_values(body, "multipart/form-data", "user").is_empty());
        assert!(form_values(b"user=alice", "text/plain", "user").is_empty());
        assert!(form_values(b"--XyZ\r\ngarbage", multipart, "user").is_empty());
    }

    #[test]
    fn multipart_part_headers_are_read_as_leniently_as_origins_read_them() {
        let multipart = "multipart/form-data; boundary=B";
        let values = |head: &str| {
            let body = format!("--B\r\n{head}\r\n\r\nvictim\r\n--B--\r\n");
            form_values(body.as_bytes(), multipart, "username")
                .into_iter()
                .map(|v| v.into_owned())
                .collect::<Vec<_>>()
        };
        for head in [
            "Content-Disposition: form-data;\r\n name=\"username\"",
            "Content-Disposition: form-data;\r\nname=\"username\"",
            "Content-Disposition: form-data; name='username'",
            "Content-Disposition: form-data; name=\"x\"; name*=UTF-8''user%6Eame",
            "content-disposition: FORM-DATA; NAME=\"Username\"",
            "Content-Disposition: form-data; name=\"username\"\r\nContent-Transfer-Encoding: 8bit",
        ] {
            assert_eq!(values(head), ["victim"], "{head}");
        }
        // An encoded value is refused: it reads as two.
        let encoded = "Content-Disposition: form-data; name=\"username\"\r\n\
                       Content-Transfer-Encoding: quoted-printable";
        assert_eq!(values(encoded).len(), 2);
        assert!(values("Content-Disposition: form-data; name=\"usernames\"").is_empty());
    }

    #[test]
    fn a_form_is_read_where_php_reads_one() {
        let body = b"username=rnd&+username=alice";
        for content_type in [
            "application/x-www-form-urlencoded",
            "application/x-www-form-urlencoded,",
            "Application/X-WWW-Form-Urlencoded charset=utf-8",
            " application/x-www-form-urlencoded;charset=utf-8",
        ] {
            assert_eq!(
                form_values(body, content_type, "username"),
                ["rnd", "alice"],
                "{content_type}"
            );
            assert!(is_form(content_type), "{content_type}");
        }
    }

    #[test]
    fn a_multipart_delimiter_starts_a_line_and_ends_it() {
        let multipart = "multipart/form-data; boundary=B";
        let part = |name: &str, value: &str| {
            format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
        };
        let values = |body: &str, content_type: &str, name: &str| {
            form_values(body.as_bytes(), content_type, name)
                .into_iter()
                .map(|v| v.into_owned())
                .collect::<Vec<_>>()
        };
        // A preamble holding what looks like a delimiter, then the parts
        // every origin reads.
        let body = format!(
            "x--B\r\n{}--B--\r\n--B\r\n{}--B \r\n{}--B--\r\n",
            part("username", "r4nd0m"),
            part("username", "victim"),
            part("password", "guess")
        );
        assert_eq!(values(&body, multipart, "username"), ["victim"]);
        assert_eq!(values(&body, multipart, "password"), ["guess"]);
        assert!(fields_readable(body.as_bytes(), multipart));
        // A value ends at the next delimiter whatever follows it, as PHP
        // and busboy end it.
        let tail = format!("--B\r\n{}--Bx4711\r\n--B--\r\n", part("username", "victim"));
        assert_eq!(values(&tail, multipart, "username"), ["victim"]);
        // PHP reads on after a closing delimiter: both values, so no bucket.
        let after = format!(
            "--B\r\n{}--B--\r\n--B\r\n{}--B--\r\n",
            part("username", "r4nd"),
            part("username", "victim")
        );
        assert_eq!(values(&after, multipart, "username"), ["r4nd", "victim"]);
        // A quoted boundary keeps its commas; a bare one ends at `,` or `;`.
        let quoted = format!(
            "--x\r\n{}--x--\r\n--x,y\r\n{}--x,y--\r\n",
            part("username", "r4nd"),
            part("username", "victim")
        );
        let comma = "multipart/form-data; boundary=\"x,y\"";
        assert_eq!(values(&quoted, comma, "username"), ["victim"]);
        assert_eq!(
            values(&body, "multipart/form-data, boundary=B", "username"),
            ["victim"]
        );
        // Line feeds alone end lines, as in PHP.
        let lf = "--B\nContent-Disposition: form-data; name=\"username\"\n\nalice\n--B--\n";
        assert_eq!(values(lf, multipart, "username"), ["alice"]);
        // A body without its closing delimiter cannot be read whole.
        let open = format!("--B\r\n{}", part("username", "victim"));
        assert!(!fields_readable(open.as_bytes(), multipart));
        assert!(!fields_readable(body.as_bytes(), "multipart/form-data"));
        let long = format!("multipart/form-data; boundary={}", "b".repeat(201));
        assert!(!fields_readable(body.as_bytes(), &long));
        assert!(fields_readable(b"a=1", "application/x-www-form-urlencoded"));
        assert!(fields_readable(b"--B--\r\n", multipart));
    }

    #[test]
    fn a_urlencoded_body_that_is_not_utf8_is_still_read() {
        let url = "application/x-www-form-urlencoded";
        assert_eq!(
            form_values(b"a=\xff&_method=DELETE", url, "_method"),
            ["DELETE"]
        );
        assert_eq!(form_values(b"a=\xff&b=\xfe", url, "a"), ["\u{fffd}"]);
    }
}
