//! Golden tests of the versioned slurmrestd layer against answers saved from the real
//! servers (`tests/fixtures/slurm/capture`: Slurm 24.11 for v0.0.40 to v0.0.42, Slurm
//! 22.05 for v0.0.38): each version's job list reads into the same job views, the
//! version is chosen from each server's OpenAPI document, the update bodies match the
//! schemas those documents give, and the error answers are recognised.

use std::path::PathBuf;

use integrations::slurm_api::shapes::{self, parse_jobs, request, Number, Request, Update};
use integrations::slurm_api::version::{choose, offered};
use integrations::slurm_api::{ApiPin, ApiVersion, JobView};
use serde_json::Value;

fn fixture(rel: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/slurm")
        .join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (dir, version, the user the jobs ran as)
const SERVERS: [(&str, ApiVersion, &str); 4] = [
    ("24.11/v0.0.40", ApiVersion::V0040, "slurmrest"),
    ("24.11/v0.0.41", ApiVersion::V0041, "slurmrest"),
    ("24.11/v0.0.42", ApiVersion::V0042, "slurmrest"),
    ("22.05", ApiVersion::V0038, "root"),
];

fn by_name<'a>(jobs: &'a [JobView], name: &str) -> &'a JobView {
    jobs.iter()
        .find(|j| j.name == name)
        .unwrap_or_else(|| panic!("no job {name} in {jobs:?}"))
}

#[test]
fn every_version_reads_into_the_same_pending_held_and_running_jobs() {
    for (dir, _, user) in SERVERS {
        let jobs = parse_jobs(&fixture(&format!("{dir}/jobs.json"))).expect(dir);
        assert_eq!(jobs.len(), 3, "{dir}");
        let p = by_name(&jobs, "pp-pending");
        assert_eq!(
            (p.base_state(), p.held, p.gpus),
            ("PENDING", false, 1),
            "{dir}"
        );
        assert_eq!(
            (p.partition.as_str(), p.user.as_str()),
            ("batch", user),
            "{dir}"
        );
        assert_eq!(p.comment, "class=training est=600", "{dir}");
        assert_eq!(p.time_limit_min, Number::Set(20), "{dir}");
        // --begin=now+3600: eligible an hour after submission
        let (submit, eligible) = (p.submit.expect("submit"), p.eligible.expect("eligible"));
        assert_eq!((eligible.0 - submit.0) / 1000, 3600, "{dir}");

        let h = by_name(&jobs, "pp-held");
        assert_eq!(
            (h.base_state(), h.held, h.gpus),
            ("PENDING", true, 2),
            "{dir}"
        );
        assert_eq!(
            (h.reason.as_str(), h.priority),
            ("JobHeldUser", Number::Set(0)),
            "{dir}"
        );
        assert!(h.to_slurm_job().is_held(), "{dir}");

        let r = by_name(&jobs, "pp-running");
        assert_eq!(
            (r.base_state(), r.held, r.gpus),
            ("RUNNING", false, 1),
            "{dir}"
        );
        assert_eq!((r.partition.as_str(), r.requeue), ("urgent", true), "{dir}");
        assert!(r.start.is_some() && r.end.is_some(), "{dir}: {r:?}");
        let s = r.to_slurm_job();
        assert_eq!(
            (s.state.as_str(), s.time_limit_s),
            ("RUNNING", Some(600.0)),
            "{dir}"
        );
    }
}

#[test]
fn the_state_is_a_string_in_v0038_and_a_list_from_v0040() {
    let old = fixture("22.05/jobs.json");
    assert!(old["jobs"][0]["job_state"].is_string());
    let new = fixture("24.11/v0.0.42/jobs.json");
    assert!(new["jobs"][0]["job_state"].is_array());
    assert!(
        new["jobs"][0]["priority"].is_object(),
        "numbers as {{set, infinite, number}}"
    );
}

#[test]
fn the_version_is_chosen_from_each_servers_openapi_document() {
    let new = offered(&fixture("24.11/openapi.json"));
    assert_eq!(new, ["v0.0.40", "v0.0.41", "v0.0.42"]);
    assert_eq!(choose(ApiPin::Auto, &new), Ok(ApiVersion::V0042));
    assert_eq!(
        choose(ApiPin::Exact(ApiVersion::V0040), &new),
        Ok(ApiVersion::V0040)
    );
    let (o, ours) =
        choose(ApiPin::Exact(ApiVersion::V0038), &new).expect_err("24.11 lacks v0.0.38");
    assert_eq!((o, ours.len()), (new.clone(), 4));

    let old = offered(&fixture("22.05/openapi.json"));
    assert_eq!(old, ["v0.0.38"]);
    assert_eq!(choose(ApiPin::Auto, &old), Ok(ApiVersion::V0038));
}

/// The schema a version's `POST /job/{id}` takes, from the server's own document.
fn update_schema(doc: &Value, v: ApiVersion) -> Value {
    let op = &doc["paths"][format!("/slurm/{v}/job/{{job_id}}")]["post"];
    let r = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}: no request body schema"));
    let name = r.trim_start_matches("#/components/schemas/");
    doc["components"]["schemas"][name].clone()
}

fn resolve(doc: &Value, prop: &Value) -> Value {
    match prop["$ref"].as_str() {
        Some(r) => {
            doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")].clone()
        }
        None => prop.clone(),
    }
}

#[test]
fn hold_release_and_begin_bodies_match_each_versions_schema() {
    for (dir, v, _) in SERVERS {
        let doc = fixture(if v == ApiVersion::V0038 {
            "22.05/openapi.json"
        } else {
            "24.11/openapi.json"
        });
        let schema = update_schema(&doc, v);
        for u in [
            Update::Hold,
            Update::Release,
            Update::BeginAt {
                unix_s: 1_900_000_000,
            },
        ] {
            let Request::Post { path, body } = request(v, 5, u, 1_899_990_000) else {
                panic!("{dir}: {u:?} is a REST call")
            };
            assert_eq!(path, format!("/slurm/{v}/job/5"));
            for (key, value) in body.as_object().expect("object") {
                let prop = resolve(&doc, &schema["properties"][key]);
                match value {
                    Value::Bool(_) => assert_eq!(prop["type"], "boolean", "{dir} {key}"),
                    Value::Number(_) => assert_eq!(prop["type"], "integer", "{dir} {key}"),
                    // v0.0.38's begin_time: the document says integer, the 22.05
                    // server parses a time string (tests/tests/slurm24.rs checks it)
                    Value::String(t) if v == ApiVersion::V0038 && key == "begin_time" => {
                        assert_eq!(prop["type"], "integer", "{dir} {key}");
                        assert_eq!(t, "now+10000");
                    }
                    Value::Object(o) => {
                        for k in o.keys() {
                            assert!(
                                prop["properties"][k].is_object(),
                                "{dir} {key}.{k} not in {prop}"
                            );
                        }
                    }
                    other => panic!("{dir} {key}: {other}"),
                }
            }
        }
    }
}

#[test]
fn the_saved_update_answers_have_no_errors_and_the_error_answers_are_recognised() {
    for (dir, v, _) in SERVERS {
        assert_eq!(
            shapes::errors(&fixture(&format!("{dir}/update_hold.json"))),
            None,
            "{dir}"
        );
        let (text, numbers) =
            shapes::errors(&fixture(&format!("{dir}/error_unknown_job.json"))).expect(dir);
        assert!(
            numbers.contains(&2017) && text.contains("Invalid job id"),
            "{dir}: {text}"
        );
        if v != ApiVersion::V0038 {
            for f in ["update_release.json", "update_begin.json"] {
                assert_eq!(
                    shapes::errors(&fixture(&format!("{dir}/{f}"))),
                    None,
                    "{dir}/{f}"
                );
            }
            let (text, numbers) =
                shapes::errors(&fixture(&format!("{dir}/error_not_owner.json"))).expect(dir);
            assert!(numbers.contains(&2010), "{dir}: {text}");
        }
    }
}

#[test]
fn a_refused_jwt_is_http_511_with_slurm_error_1007_and_a_missing_one_401() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/slurm/24.11");
    let read = |f: &str| std::fs::read_to_string(path.join(f)).expect(f);
    let wrong = read("error_jwt_wrong_token.txt");
    let (status, body) = wrong.split_once('\n').expect("status line");
    assert_eq!(status, "511");
    let body: Value = serde_json::from_str(body).expect("json");
    let (_, numbers) = shapes::errors(&body).expect("errors");
    assert_eq!(numbers, [1007]);
    assert!(read("error_jwt_no_token.txt").starts_with("401\n"));
    assert!(read("error_v0.0.38_not_served.txt").starts_with("404\n"));
}
