//! A filesystem of the test's own for the disk faults: an ext4 image in a file,
//! loop-mounted, that a test can freeze (`fsfreeze`: every write waits) or fill (a
//! file written until the disk has no space left). Needs root, a loop device,
//! `mkfs.ext4` and util-linux, as the dev and CI machines have.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// An ext4 filesystem in a file, loop-mounted at `dir`; thawed and unmounted on drop,
/// whatever the test did to it.
pub struct Disk {
    pub dir: PathBuf,
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("this test needs {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Disk {
    /// An ext4 filesystem of `size` (`truncate -s`: `64M`) in `image`, mounted at `dir`.
    pub fn mount(image: &Path, dir: &Path, size: &str) -> Disk {
        run("truncate", &["-s", size, &image.display().to_string()]);
        run("mkfs.ext4", &["-q", &image.display().to_string()]);
        std::fs::create_dir_all(dir).expect("mount point");
        run(
            "mount",
            &[
                "-o",
                "loop",
                &image.display().to_string(),
                &dir.display().to_string(),
            ],
        );
        Disk {
            dir: dir.to_path_buf(),
        }
    }

    pub fn freeze(&self) {
        run("fsfreeze", &["--freeze", &self.dir.display().to_string()]);
    }

    /// Writes `filler` on the disk until no space is left.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.dir.join("filler");
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![0x5au8; 1 << 16];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
        filler
    }

    pub fn thaw(&self) {
        let _ = Command::new("fsfreeze")
            .args(["--unfreeze", &self.dir.display().to_string()])
            .output();
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.thaw();
        let _ = Command::new("umount")
            .args(["-l", &self.dir.display().to_string()])
            .output();
    }
}
