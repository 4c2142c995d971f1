use super::*;

const DEMO: &str = include_str!("../../../examples/demo/site.toml");

#[test]
fn the_demo_site_parses_into_its_topology() {
    let site = Site::parse("site.toml", DEMO).expect("valid");
    assert_eq!(site.racks.len(), 6);
    assert_eq!(site.nodes.len(), 24);
    assert_eq!(site.gpu_count(), 192);
    assert_eq!(site.gpus().len(), 192);
    assert!((site.facility_budget_kw() - 44.0).abs() < 1e-9);
    let a01 = site.rack("a01").expect("rack a01");
    assert!(
        (a01.power_budget_kw - 7.2).abs() < 1e-9,
        "9 kW pdu derated by 0.8"
    );
    assert_eq!(a01.cooling, "crah-a");
    assert_eq!(
        site.cooling_of("b02").map(|c| c.id.as_str()),
        Some("crah-b")
    );
    assert_eq!(site.nodes[0].id, "a01-n01");
    assert_eq!(site.gpus()[9].id.to_string(), "gpu/a01-n02:1");
}

#[test]
fn a_broken_site_reports_every_problem_with_its_position() {
    let src = r#"version = 1
[site]
name = "bad site"

[[feeds]]
id = "utility"
rating_kw = -5

[[pdus]]
id = "pdu-1"
feed = "nowhere"
rating_kw = 10

[[cooling]]
id = "crah"
capacity_kw = 10
racks = ["r1", "ghost"]

[[rooms]]
id = "hall"
[[rows]]
id = "row"
room = "hall"

[[racks]]
id = "r1"
row = "row"
pdus = ["pdu-1"]
inlet_limit_c = 90
nodes = 2
gpu_model = "Z9000"

[[racks]]
id = "r1"
row = "row"
pdus = ["pdu-1"]
"#;
    let err = Site::parse("site.toml", src).expect_err("invalid");
    let text = err.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        vec![
            "site.toml:3:8: site \"bad site\": ids may hold letters, digits, '-', '_' and '.', not ' '",
            "site.toml:7:13: feed \"utility\": rating_kw must be within 0.001..=1000000, got -5",
            "site.toml:11:8: pdu \"pdu-1\" refers to unknown feed \"nowhere\"",
            "site.toml:17:16: cooling unit \"crah\" refers to unknown rack \"ghost\"",
            "site.toml:29:17: rack \"r1\": inlet_limit_c must be within 15..=45, got 90",
            "site.toml:31:13: rack \"r1\": unknown gpu_model \"Z9000\" (known: A100, A40, H100, H200, P100, RTX6000, V100; define others under [gpu_models])",
            "site.toml:34:6: rack \"r1\" is defined twice",
        ],
        "{text}"
    );
}

#[test]
fn syntax_and_unknown_fields_name_their_position() {
    let err = Site::parse("s.toml", "version = 1\n[site]\nname = \"x\"\ncolour = 3\n")
        .expect_err("unknown field");
    let text = err.to_string();
    assert!(
        text.starts_with("s.toml:4:1: unknown field `colour`"),
        "{text}"
    );
    let err = Site::parse("s.toml", "version = 1\n[site\n").expect_err("syntax");
    assert!(err.to_string().starts_with("s.toml:2:"), "{err}");
}

#[test]
fn a_rack_needs_cooling_and_a_site_needs_a_feed() {
    let src = "version = 2\n[site]\nname = \"x\"\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"r\"\nroom = \"h\"\n[[racks]]\nid = \"k\"\nrow = \"r\"\npower_budget_kw = 5\n";
    let err = Site::parse("s.toml", src).expect_err("invalid");
    let text = err.to_string();
    assert!(
        text.contains("s.toml:1:1: the site needs at least one [[feeds]] entry"),
        "{text}"
    );
    assert!(
        text.contains("s.toml:1:11: unsupported site file version 2"),
        "{text}"
    );
    assert!(
        text.contains("s.toml:10:6: rack \"k\" is served by no cooling unit"),
        "{text}"
    );
}

#[test]
fn the_power_path_reaches_each_node_through_its_outlets() {
    let src = r#"version = 1
[site]
name = "s"
[[feeds]]
id = "f"
rating_kw = 100
[[pdus]]
id = "p1"
feed = "f"
rating_kw = 20
branches = [{ id = "A", rating_kw = 7 }]
outlets = [{ id = "A1", branch = "A", rating_kw = 3.7 }, { id = "A2", branch = "Z", rating_kw = 3.7 }]
[[cooling]]
id = "c"
capacity_kw = 30
racks = ["r"]
[[rooms]]
id = "h"
[[rows]]
id = "w"
room = "h"
[[racks]]
id = "r"
row = "w"
pdus = ["p1"]
[[nodes]]
id = "n1"
rack = "r"
gpus = 8
gpu_model = "H100"
outlets = ["p1.A1"]
[[nodes]]
id = "n2"
rack = "r"
gpus = 8
gpu_model = "H100"
outlets = ["p1.B9"]
"#;
    let err = Site::parse("s.toml", src).expect_err("two bad references");
    assert_eq!(
        err.to_string(),
        "s.toml:12:80: pdu \"p1\" outlet \"A2\" refers to unknown branch \"Z\"\n\
         s.toml:37:12: node \"n2\" refers to unknown outlet \"p1.B9\" (write it pdu.outlet)"
    );
    let fixed = src.replace("\"Z\"", "\"A\"").replace("p1.B9", "p1.A2");
    let site = Site::parse("s.toml", &fixed).expect("valid");
    assert_eq!(site.nodes[0].outlets, vec!["p1.A1".to_string()]);
    assert_eq!(site.pdus[0].outlets[0].branch.as_deref(), Some("A"));
    assert!(site
        .entities()
        .contains(&EntityId::new(EntityKind::Outlet, "p1.A2")));
    assert_eq!(site.gpus().len(), 16);
}

#[test]
fn redfish_bindings_are_checked_against_the_site_with_positions() {
    let good = format!(
        "{DEMO}\n[[redfish]]\nendpoint = \"bmc\"\nresource = \"/redfish/v1/Chassis/1U/Sensors/IntakeTemp\"\nentity = \"rack/a01\"\nmetric = \"inlet_temp_c\"\n\n[[redfish]]\nendpoint = \"bmc\"\nresource = \"Systems/1/Processors/*/EnvironmentMetrics\"\nproperty = \"/PowerWatts/Reading\"\nentity = \"gpu/a01-n01:0\"\nmetric = \"power_w\"\ncombine = \"sum\"\n"
    );
    let site = Site::parse("site.toml", &good).expect("valid bindings");
    assert_eq!(site.redfish.len(), 2);
    let b = &site.redfish[1];
    assert_eq!(
        b.resource.to_string(),
        "Systems/1/Processors/*/EnvironmentMetrics"
    );
    assert_eq!(b.property.as_deref(), Some("PowerWatts"));
    assert_eq!(b.combine, Some(redfish::Combine::Sum));
    assert!(
        site.redfish[0].at.starts_with("site.toml:"),
        "{}",
        site.redfish[0].at
    );

    let bad = format!(
        "{DEMO}\n[[redfish]]\nendpoint = \"bmc\"\nresource = \"Chassis/**/Sensors\"\nentity = \"rack/z9\"\nmetric = \"inlet_temp\"\ncombine = \"median\"\n"
    );
    let e = Site::parse("site.toml", &bad)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("median"), "an unknown combine: {e}");
    let bad = format!(
        "{DEMO}\n[[redfish]]\nendpoint = \"bmc\"\nresource = \"Chassis/**/Sensors\"\nentity = \"rack/z9\"\nmetric = \"inlet_temp\"\n"
    );
    let e = Site::parse("site.toml", &bad)
        .expect_err("refused")
        .to_string();
    for want in [
        "** may only be the last segment",
        "entity rack/z9: the site defines no such entity",
        "unknown metric \"inlet_temp\"",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
    assert_eq!(e.lines().count(), 3, "every problem at once: {e}");
    assert!(e.lines().all(|l| l.starts_with("site.toml:")), "{e}");
}

#[test]
fn a_gpu_models_speed_is_over_zero_and_defaults_to_the_reference() {
    let model = |speed: &str| {
        format!(
            "version = 1\n[site]\nname = \"x\"\n[[feeds]]\nid = \"f\"\nrating_kw = 10\n[[cooling]]\nid = \"c\"\ncapacity_kw = 10\nracks = [\"k\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"r\"\nroom = \"h\"\n[gpu_models.OLD]\nmin_w = 100\nmax_w = 250\n{speed}\n[[racks]]\nid = \"k\"\nrow = \"r\"\npower_budget_kw = 5\nnodes = 1\ngpu_model = \"OLD\"\n"
        )
    };
    let site = Site::parse("s.toml", &model("speed = 0.52")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(site.gpus()[0].model.speed, 0.52);
    let site = Site::parse("s.toml", &model("")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(site.gpus()[0].model.speed, 1.0);
    for bad in ["speed = 0", "speed = -1", "speed = 101"] {
        let err = Site::parse("s.toml", &model(bad)).expect_err(bad);
        assert!(
            err.to_string().contains("gpu model \"OLD\": speed"),
            "{bad}: {err}"
        );
    }
}
