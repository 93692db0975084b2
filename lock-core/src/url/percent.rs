//! Percent coding of the user info, path and query.

/// Decodes `%XX` escapes; `what` names the part of the URL for the error message, which never
/// quotes the text (it may be a password).
pub(super) fn decode(s: &str, what: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let high = bytes.get(i + 1).copied().and_then(hex_value);
            let low = bytes.get(i + 2).copied().and_then(hex_value);
            let (Some(high), Some(low)) = (high, low) else {
                return Err(format!(
                    "invalid percent-escape in the {what} (`%` must be followed by two hex digits)"
                ));
            };
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| format!("the {what} is not valid UTF-8 after percent-decoding"))
}

/// The value of one hexadecimal digit.
fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-encodes every byte except the unreserved ASCII letters, digits, `-`, `.`, `_`, `~`.
pub(super) fn encode(s: &str) -> String {
    encode_except(s, b"")
}

/// Like [`encode`], keeping `/` as it is: the separator of path segments.
pub(super) fn encode_path(s: &str) -> String {
    encode_except(s, b"/")
}

fn encode_except(s: &str, keep: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || keep.contains(&b)
        {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}
