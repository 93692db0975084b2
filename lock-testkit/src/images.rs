//! Which container image holds which server binary, and where inside it.
//!
//! Two sets, chosen by `DISTLOCK_TESTKIT_IMAGES`: `official` (the default; pulled by the
//! engine on first use) and `local` (tags built by `scripts/local-images.sh` from this
//! machine's Debian packages; never pulled).

use std::path::{Path, PathBuf};

/// The variable choosing the image set.
pub(crate) const IMAGES_ENV: &str = "DISTLOCK_TESTKIT_IMAGES";

/// One server's image in one set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Image {
    /// Repository, e.g. `redis` or `distlock-local/redis`.
    pub(crate) repository: &'static str,
    /// Tag, e.g. `7.2`.
    pub(crate) tag: &'static str,
    /// The directory holding the binaries inside the image.
    pub(crate) bin_dir: &'static str,
    /// `setpriv` inside the image, to run the server as a non-root user (`None`: the image
    /// has none and the server runs as the image's user).
    pub(crate) setpriv: Option<&'static str>,
    /// True for images built by `scripts/local-images.sh` (never pulled).
    pub(crate) local: bool,
}

impl Image {
    /// `repository:tag`.
    pub(crate) fn reference(&self) -> String {
        format!("{}:{}", self.repository, self.tag)
    }
}

/// A server kind: its binaries and its image in each set.
struct Server {
    binaries: &'static [&'static str],
    official: Image,
    local: Image,
}

/// Every server the test kit starts. The official images' binaries: `redis` installs
/// into `/usr/local/bin`, etcd's release image too, `postgres` under
/// `/usr/lib/postgresql/<major>/bin`; the Debian-based ones (redis, postgres) carry
/// util-linux's `setpriv`, etcd's (distroless) does not.
const SERVERS: [Server; 3] = [
    Server {
        binaries: &["redis-server", "redis-sentinel"],
        official: Image {
            repository: "redis",
            tag: "7.2",
            bin_dir: "/usr/local/bin",
            setpriv: Some("/usr/bin/setpriv"),
            local: false,
        },
        local: Image {
            repository: "distlock-local/redis",
            tag: "debian",
            bin_dir: "/usr/bin",
            setpriv: Some("/usr/bin/setpriv"),
            local: true,
        },
    },
    Server {
        binaries: &["etcd"],
        official: Image {
            repository: "gcr.io/etcd-development/etcd",
            tag: "v3.5.17",
            bin_dir: "/usr/local/bin",
            setpriv: None,
            local: false,
        },
        local: Image {
            repository: "distlock-local/etcd",
            tag: "debian",
            bin_dir: "/usr/bin",
            setpriv: Some("/usr/bin/setpriv"),
            local: true,
        },
    },
    Server {
        binaries: &["postgres", "initdb"],
        official: Image {
            repository: "postgres",
            tag: "17",
            bin_dir: "/usr/lib/postgresql/17/bin",
            setpriv: Some("/usr/bin/setpriv"),
            local: false,
        },
        local: Image {
            repository: "distlock-local/postgres",
            tag: "debian",
            bin_dir: "/usr/lib/postgresql/local/bin",
            setpriv: Some("/usr/bin/setpriv"),
            local: true,
        },
    },
];

/// True when `DISTLOCK_TESTKIT_IMAGES=local`.
///
/// # Panics
///
/// On a value other than `official`, `local` or empty.
fn local_set() -> bool {
    match std::env::var(IMAGES_ENV).as_deref() {
        Err(_) | Ok("") | Ok("official") => false,
        Ok("local") => true,
        Ok(other) => panic!(
            "lock-testkit: {IMAGES_ENV}={other:?} is not an image set: use `official` \
             (the default) or `local` (built by scripts/local-images.sh)"
        ),
    }
}

/// The image holding the server binary `name` (a file name such as `redis-server`), in
/// the set `DISTLOCK_TESTKIT_IMAGES` selects; `None` for a binary no image holds (a host
/// tool such as `redis-cli`).
pub(crate) fn image_for(name: &str) -> Option<Image> {
    let server = SERVERS.iter().find(|s| s.binaries.contains(&name))?;
    Some(if local_set() {
        server.local
    } else {
        server.official
    })
}

/// The image for the program at `path` (by its file name), with the path the program has
/// inside it.
pub(crate) fn image_for_program(path: &Path) -> Option<(Image, PathBuf)> {
    let name = path.file_name()?.to_str()?;
    let image = image_for(name)?;
    Some((image, Path::new(image.bin_dir).join(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_binary_maps_into_its_image() {
        for server in &SERVERS {
            for image in [server.official, server.local] {
                assert!(image.bin_dir.starts_with('/'));
                assert!(!image.reference().is_empty());
            }
        }
        let image = image_for("redis-server").expect("redis has an image");
        assert!(image.repository.ends_with("redis"));
        assert!(image_for("redis-cli").is_none());
        let (_, inside) =
            image_for_program(Path::new("/somewhere/initdb")).expect("postgres image");
        assert!(inside.ends_with("initdb"));
        assert!(inside.starts_with(image_for("postgres").unwrap().bin_dir));
    }
}
