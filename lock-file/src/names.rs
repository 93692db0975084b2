//! Key → lock file name: readable where the key is, safe for every key, stable forever
//! (the name is the lock: two versions that named a key differently would not exclude
//! each other).
//!
//! Bytes `A-Z a-z 0-9 - _` and `.` (except a leading one) are kept; every other byte is
//! `%XX` (upper-case hex), so `/`, NUL, `..`, control characters and non-ASCII never reach
//! the file system as such. A name whose encoding passes [`MAX_ENCODED`] bytes keeps its
//! first bytes and ends in `~` and a 128-bit FNV-1a hash of the whole key: file names stay
//! under the 255 bytes of common file systems. Two keys sharing a name only exclude each
//! other more than asked (a collision costs waiting, never exclusion).

/// The longest encoded key kept whole; longer ones are cut and hashed.
const MAX_ENCODED: usize = 200;

/// What a cut key keeps of its encoding before `~` and the hash.
const KEPT: usize = 160;

/// The suffix of lock files.
pub(crate) const LOCK_SUFFIX: &str = ".lock";

/// The suffix of the raw baseline's files (never a lock's).
pub(crate) const RAW_SUFFIX: &str = ".raw";

/// The file name of `key`'s lock, with `suffix`.
pub(crate) fn file_name(key: &str, suffix: &str) -> String {
    let mut out = String::with_capacity(key.len() + suffix.len());
    for (i, b) in key.bytes().enumerate() {
        let keep = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0);
        if keep {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0xf));
        }
    }
    if out.len() > MAX_ENCODED {
        let mut cut = KEPT;
        // Never in the middle of a `%XX`.
        while out.as_bytes()[cut - 1] == b'%' || out.as_bytes()[cut - 2] == b'%' {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('~');
        out.push_str(&format!("{:032x}", fnv1a_128(key.as_bytes())));
    }
    out.push_str(suffix);
    out
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(n)])
}

/// FNV-1a, 128 bits: stable across builds and platforms (a file name is on-disk format).
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    bytes.iter().fold(OFFSET, |hash, &b| {
        (hash ^ u128::from(b)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_keys_stay_readable_and_the_rest_is_escaped() {
        assert_eq!(
            file_name("jobs-nightly_1.v2", ".lock"),
            "jobs-nightly_1.v2.lock"
        );
        assert_eq!(file_name("jobs/nightly", ".lock"), "jobs%2Fnightly.lock");
        assert_eq!(file_name("..", ".lock"), "%2E..lock");
        assert_eq!(file_name(".hidden", ".lock"), "%2Ehidden.lock");
        assert_eq!(file_name("a b%", ".lock"), "a%20b%25.lock");
        assert_eq!(file_name("é\0", ".lock"), "%C3%A9%00.lock");
    }

    #[test]
    fn long_keys_are_cut_and_hashed_and_stay_distinct() {
        let a = "/".repeat(1000);
        let b = format!("{}x", "/".repeat(999));
        let (na, nb) = (file_name(&a, ".lock"), file_name(&b, ".lock"));
        assert_ne!(na, nb);
        assert!(na.len() <= 255 && nb.len() <= 255, "{na}");
        assert!(!na.contains('/'));
        // Not cut inside a `%XX`.
        let stem = na.split('~').next().unwrap();
        assert!(stem.len() % 3 == 0, "{stem}");
        let short = "k".repeat(MAX_ENCODED);
        assert_eq!(file_name(&short, ""), short);
    }

    #[test]
    fn the_hash_is_the_published_fnv1a() {
        // FNV-1a 128 of "a" (the reference value of the FNV authors' test suite).
        assert_eq!(fnv1a_128(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
    }
}
