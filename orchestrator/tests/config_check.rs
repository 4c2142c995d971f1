//! `powerplane serve --check`, `policy check` and `site check` report every problem of
//! a file in one pass, each as file:line:col, instead of stopping at the first.

use std::path::Path;
use std::process::Command;

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
}

fn stderr_of(cmd: &mut Command) -> String {
    let out = cmd.output().expect("powerplane runs");
    assert!(!out.status.success(), "a broken file must fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn serve_check_lists_every_problem_of_the_config_and_the_files_it_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root().join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    // the policy file is missing; the config has an unknown key, a wrong type and an
    // out-of-range tick
    std::fs::write(
        d.join("powerplane.toml"),
        "[controller]\nsite = \"site.toml\"\npolicy = \"nowhere.toml\"\ntick_s = 0\nticks = 4\nbuffer_samples = \"many\"\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n",
    )
    .expect("config");
    let err = stderr_of(
        powerplane()
            .args(["serve", "--check", "--config"])
            .arg(d.join("powerplane.toml")),
    );
    assert!(
        err.contains("powerplane.toml:5:1: unknown field `ticks`"),
        "{err}"
    );
    assert!(err.contains("powerplane.toml:6:18: invalid type"), "{err}");
    // once the shape is right, the values and the named files are checked together
    std::fs::write(
        d.join("powerplane.toml"),
        "[controller]\nsite = \"site.toml\"\npolicy = \"nowhere.toml\"\ntick_s = 0\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n",
    )
    .expect("config");
    let err = stderr_of(
        powerplane()
            .args(["serve", "--check", "--config"])
            .arg(d.join("powerplane.toml")),
    );
    assert!(err.contains("nowhere.toml"), "{err}");
    assert!(
        err.contains("controller.tick_s must be within 0.1..=3600, got 0"),
        "{err}"
    );
}

#[test]
fn policy_check_lists_unknown_keys_and_wrong_types_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("policy.toml");
    let text = std::fs::read_to_string(root().join("examples/demo/policy.toml")).expect("policy");
    // two unknown top-level keys and a wrong type, far apart
    let broken = format!("colour = \"red\"\n{text}\nowner = 7\n");
    std::fs::write(&p, &broken).expect("policy");
    let err = stderr_of(powerplane().args(["policy", "check"]).arg(&p));
    let lines = broken.lines().count();
    assert!(
        err.contains("policy.toml:1:1: unknown field `colour`"),
        "{err}"
    );
    assert!(
        err.contains(&format!("policy.toml:{lines}:1: unknown field `owner`")),
        "{err}"
    );
}

#[test]
fn site_check_lists_every_unknown_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("site.toml");
    let text = std::fs::read_to_string(root().join("examples/demo/site.toml")).expect("site");
    let broken = format!("nickname = \"hall\"\n{text}\nowner = \"x\"\n");
    std::fs::write(&p, &broken).expect("site");
    let err = stderr_of(powerplane().args(["site", "check"]).arg(&p));
    let lines = broken.lines().count();
    assert!(
        err.contains("site.toml:1:1: unknown field `nickname`"),
        "{err}"
    );
    assert!(
        err.contains(&format!("site.toml:{lines}:1: unknown field `owner`")),
        "{err}"
    );
}

#[test]
fn secrets_come_from_files_and_both_forms_at_once_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    for f in ["site.toml", "policy.toml"] {
        std::fs::copy(root().join("examples/demo").join(f), d.join(f)).expect("copy");
    }
    std::fs::write(
        d.join("mapping.toml"),
        "version = 1\n\n[[json]]\ntopic = \"dc1/{rack}/inlet\"\nentity = \"rack/{rack}\"\nmetric = \"inlet_temp_c\"\nvalue = \"\"\n",
    )
    .expect("mapping");
    let write = |store: &str, mqtt: &str, bmc: &str| {
        std::fs::write(
            d.join("powerplane.toml"),
            format!("[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n\n[store]\nkind = \"redis\"\n{store}\n\n[mqtt]\nmapping = \"mapping.toml\"\nurl = \"mqtt://127.0.0.1:1883\"\nusername = \"pp\"\n{mqtt}\n\n[redfish]\n[[redfish.endpoints]]\nname = \"pdu\"\nurl = \"http://127.0.0.1:9\"\nauth = {{ kind = \"basic\", username = \"monitor\", {bmc} }}\n"),
        )
        .expect("config");
    };
    let check = || {
        powerplane()
            .args(["serve", "--check", "--config"])
            .arg(d.join("powerplane.toml"))
            .output()
            .expect("powerplane runs")
    };
    // both forms of each secret, and a url_file that is not there
    write(
        "url = \"redis://127.0.0.1:6379\"\nurl_file = \"redis.url\"",
        "password = \"x\"\npassword_file = \"mqtt.password\"",
        "password = \"y\", password_file = \"bmc.password\"",
    );
    std::fs::write(d.join("mqtt.password"), "secret\n").expect("password");
    let out = check();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs exactly one of url or url_file"),
        "{err}"
    );
    assert!(
        err.contains("[mqtt] give one of password or password_file"),
        "{err}"
    );
    assert!(
        err.contains("[[redfish.endpoints]] pdu: give one of password or password_file"),
        "{err}"
    );
    std::fs::write(d.join("bmc.password"), "bmc-secret\n").expect("password");
    write(
        "url_file = \"redis.url\"",
        "password_file = \"mqtt.password\"",
        "password_file = \"bmc.password\"",
    );
    let err = String::from_utf8_lossy(&check().stderr).into_owned();
    assert!(err.contains("url_file: cannot read"), "{err}");
    // the files there: the config is valid
    std::fs::write(d.join("redis.url"), "redis://:pw@127.0.0.1:6379\n").expect("url");
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn config_check_names_every_problem_of_ha_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root().join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root().join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    std::fs::write(d.join("site.key"), "9e".repeat(32)).expect("key");
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(d.join("site.key"), private).expect("chmod");
    // the embedded store, a renewal too slow for the lease, an agents' lease shorter
    // than a failover, an instance with a space
    std::fs::write(
        d.join("powerplane.toml"),
        "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 1\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[ha]\nenabled = true\nlease_s = 10\nrenew_s = 5\ninstance = \"head node\"\n\n[agents]\nkey_file = \"site.key\"\nlease_s = 11\nrenew_s = 3\nretry_s = 1\n[agents.mqtt]\nurl = \"mqtt://127.0.0.1:1883\"\n",
    )
    .expect("config");
    let err = stderr_of(
        powerplane()
            .args(["serve", "--check", "--config"])
            .arg(d.join("powerplane.toml")),
    );
    for want in [
        "[ha] needs [store] kind = \"redis\"",
        "[ha] renew_s must be above 0 and at most lease_s / 3",
        "[ha] instance \"head node\"",
        "[agents] lease_s (11) must be above [ha] lease_s + 2 × controller.tick_s (12)",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn serve_check_names_every_problem_of_node_power_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root().join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::write(d.join("policy.toml"), "version = 1\n").expect("policy");
    let config = |node_power: &str| {
        std::fs::write(
            d.join("powerplane.toml"),
            format!("[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[node_power]\n{node_power}"),
        )
        .expect("config");
        d.join("powerplane.toml")
    };
    // Slurm: a url that is Redfish's, systems it does not read, a node the site lacks,
    // an empty scontrol and a zero deadline, all in one answer
    let err = stderr_of(powerplane().args(["serve", "--check", "--config"]).arg(config(
        "backend = \"slurm\"\nurl = \"http://bmc\"\nscontrol = []\ntimeout_s = 0\nsystems = { \"a01-n01\" = \"/redfish/v1/Systems/1\" }\nnodes = { \"a01-n01\" = \"pp-save1\", \"z99-n99\" = \"pp-save2\" }\n",
    )));
    for want in [
        "url is for backend = \"redfish\"",
        "systems is not read with backend = \"slurm\"",
        "[node_power.nodes]: z99-n99 is not a node of the site",
        "scontrol must name a command",
        "timeout_s and poll_s must be positive (got 0 and 5)",
    ] {
        assert!(err.contains(want), "{want}:\n{err}");
    }
    // an unknown backend is a shape error with its position
    let err = stderr_of(
        powerplane()
            .args(["serve", "--check", "--config"])
            .arg(config(
                "backend = \"ipmi\"\nnodes = { \"a01-n01\" = \"n1\" }\n",
            )),
    );
    assert!(
        err.contains("powerplane.toml:8:11: unknown variant `ipmi`"),
        "{err}"
    );
    // Redfish (the default) needs its url and binds systems; nothing bound is refused
    let err = stderr_of(
        powerplane()
            .args(["serve", "--check", "--config"])
            .arg(config("nodes = { \"a01-n01\" = \"n1\" }\n")),
    );
    assert!(err.contains("backend = \"redfish\" needs url"), "{err}");
    assert!(
        err.contains("nodes is not read with backend = \"redfish\""),
        "{err}"
    );
    assert!(err.contains("[node_power] systems: no node bound"), "{err}");
    // a good Slurm section passes
    let out = powerplane()
        .args(["serve", "--check", "--config"])
        .arg(config(
            "backend = \"slurm\"\nscontrol = [\"chroot\", \"/srv/slurm\", \"scontrol\"]\nnodes = { \"a01-n01\" = \"pp-save1\" }\n",
        ))
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
