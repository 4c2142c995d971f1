//! Which job a GPU process belongs to: the Slurm job id from the process's cgroup
//! (`.../job_1234/...`, cgroup v1 and v2) or, failing that, its `SLURM_JOB_ID`; the
//! Kubernetes pod UID from the cgroup path (`kubepods-...-pod<uid>.slice` under systemd,
//! `/kubepods/.../pod<uid>/...` under cgroupfs).

use std::path::Path;

/// `slurm:JOBID` or `k8s:POD-UID`, when the process's cgroup or environment tells.
pub fn job_of(proc_root: &Path, pid: u32) -> Option<String> {
    let dir = proc_root.join(pid.to_string());
    if let Ok(cg) = std::fs::read_to_string(dir.join("cgroup")) {
        if let Some(j) = from_cgroup(&cg) {
            return Some(j);
        }
    }
    // environ needs the same user or CAP_SYS_PTRACE; unreadable is fine
    let env = std::fs::read(dir.join("environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        let id = kv.strip_prefix("SLURM_JOB_ID=")?;
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| format!("slurm:{id}"))
    })
}

/// The job named by the text of `/proc/PID/cgroup`.
pub fn from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        // hierarchy-ID:controllers:path
        let path = line.splitn(3, ':').nth(2).unwrap_or(line);
        for seg in path.split('/') {
            if let Some(id) = seg.strip_prefix("job_") {
                if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
                    return Some(format!("slurm:{id}"));
                }
            }
            if let Some(uid) = pod_uid(seg) {
                return Some(format!("k8s:{uid}"));
            }
        }
    }
    None
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".slice").unwrap_or(seg);
    let at = seg.rfind("pod")?;
    if at > 0 && !seg[..at].ends_with('-') {
        return None;
    }
    let uid = seg[at + 3..].replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            if [8, 13, 18, 23].contains(&i) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    ok.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_jobs_come_from_cgroup_v1_and_v2_paths() {
        assert_eq!(
            from_cgroup("0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0\n"),
            Some("slurm:4711".into())
        );
        assert_eq!(
            from_cgroup("12:devices:/slurm/uid_1000/job_88/step_batch\n4:memory:/slurm/uid_1000/job_88/step_batch\n"),
            Some("slurm:88".into())
        );
    }

    #[test]
    fn kubernetes_pods_come_from_systemd_and_cgroupfs_paths() {
        assert_eq!(
            from_cgroup("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2b6c1e_3a4d_4b5c_9d8e_112233445566.slice/cri-containerd-abc.scope\n"),
            Some("k8s:0f2b6c1e-3a4d-4b5c-9d8e-112233445566".into())
        );
        assert_eq!(
            from_cgroup("0::/kubepods/besteffort/pod0f2b6c1e-3a4d-4b5c-9d8e-112233445566/abcdef\n"),
            Some("k8s:0f2b6c1e-3a4d-4b5c-9d8e-112233445566".into())
        );
        assert_eq!(
            from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(from_cgroup("0::/kubepods/podnotauid/x\n"), None);
    }

    #[test]
    fn the_environment_is_the_fallback() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("42");
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::write(p.join("cgroup"), "0::/user.slice\n").expect("write");
        std::fs::write(
            p.join("environ"),
            b"HOME=/root\0SLURM_JOB_ID=991\0PATH=/bin\0",
        )
        .expect("write");
        assert_eq!(job_of(dir.path(), 42), Some("slurm:991".into()));
        assert_eq!(
            job_of(dir.path(), 43),
            None,
            "a vanished process has no job"
        );
    }
}
