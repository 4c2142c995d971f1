//! The OpenAPI 3 description of the API (`/api/v1/openapi.json`).

use serde_json::json;

use super::RECENT_DECISIONS;

/// The OpenAPI 3 description of the API.
pub fn openapi() -> serde_json::Value {
    let get = |summary: &str, role: &str| {
        json!({ "get": {
            "summary": summary,
            "description": format!("Needs a {role} token."),
            "security": [{ "bearer": [] }],
            "responses": {
                "200": { "description": "OK", "content": { "application/json": {} } },
                "401": { "description": "no token, or an unknown one" },
                "403": { "description": "the token's role may not do this" }
            }
        }})
    };
    let mut decisions = get("Recent decisions, newest first", "viewer");
    decisions["get"]["parameters"] = json!([
        { "name": "rule", "in": "query", "schema": { "type": "string" }, "description": "a rule or a rule family (`thermal` matches `thermal.inlet`)" },
        { "name": "action", "in": "query", "schema": { "type": "string", "enum": ["cap", "uncap", "hold", "release"] } },
        { "name": "target", "in": "query", "schema": { "type": "string" }, "description": "substring of the target (`rack/a01`, `slurm:12`)" },
        { "name": "since", "in": "query", "schema": { "type": "string", "format": "date-time" } },
        { "name": "limit", "in": "query", "schema": { "type": "integer", "minimum": 1, "maximum": RECENT_DECISIONS, "default": 100 } }
    ]);
    json!({
        "openapi": "3.0.3",
        "info": { "title": "powerplane", "version": "1", "description": "The controller's status, decisions and agents. Roles: viewer < operator < admin." },
        "components": { "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } } },
        "paths": {
            "/": { "get": { "summary": "The status page (HTML; a bearer token or the session cookie of POST /login, unless status_page_public)", "responses": { "200": { "description": "text/html" }, "401": { "description": "the login form" } } } },
            "/login": { "post": { "summary": "Log in to the status page: a form field token=...; sets an HttpOnly, SameSite=Strict session cookie and redirects to /", "requestBody": { "required": true, "content": { "application/x-www-form-urlencoded": {} } }, "responses": { "303": { "description": "logged in" }, "401": { "description": "unknown token; the login form again" } } } },
            "/logout": { "post": { "summary": "End the session of the cookie sent", "responses": { "303": { "description": "logged out" } } } },
            "/healthz": { "get": { "summary": "Alive: 200 while the process serves", "responses": { "200": { "description": "alive" } } } },
            "/readyz": { "get": { "summary": "Ready: the store reachable, the policy valid, the sources fresh; the HA role", "responses": { "200": { "description": "ready, with each check" }, "503": { "description": "not ready, naming each failing check" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics (public unless metrics_public = false)", "responses": { "200": { "description": "text exposition format 0.0.4" } } } },
            "/api/v1/status": get("The site at a glance: facility power against budget, price, caps and holds in force, each rack's predicted inlet headroom (limit − margin − predicted peak, and when)", "viewer"),
            "/api/v1/racks": get("Per rack: power, budget, headroom, inlet against its limit, caps, the predicted inlet (predictive thermal rule)", "viewer"),
            "/api/v1/gpus": get("Per GPU: power, temperature, cap in force, and what its agent acknowledged and enforces", "viewer"),
            "/api/v1/schedulers": get("The schedulers powerplane steers: Slurm's holds that are powerplane's, call counters and the last error, every job's lifecycle and the recent transitions", "viewer"),
            "/api/v1/holds": get("Jobs held by powerplane, with their leases", "viewer"),
            "/api/v1/jobs": get("Pending and running jobs, each with its hold if powerplane holds it", "viewer"),
            "/api/v1/policy": get("The policy in force, as written (file, text, sha256, loaded_at), and the outcome of the last reload (valid, last_error as file:line:col lines, reloads)", "viewer"),
            "/api/v1/decisions": decisions,
            "/api/v1/overrides": {
                "get": { "summary": "Overrides in force", "description": "Needs a viewer token.", "security": [{ "bearer": [] }], "responses": { "200": { "description": "OK" } } },
                "post": {
                    "summary": "Set an override with an expiry: pin a rack's GPUs at a cap, or exempt a job from holds",
                    "description": "Needs an operator token. Body: {\"kind\": \"pin_rack_cap\", \"rack\": \"a01\", \"watts_per_gpu\": 200, \"for_s\": 3600, \"reason\": \"...\"} or {\"kind\": \"exempt_job\", \"job\": \"slurm:1234\", \"for_s\": 3600}. A pin never raises a lower cap of the policy.",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": {} } },
                    "responses": { "201": { "description": "set" }, "400": { "description": "invalid, with the reason" }, "403": { "description": "not an operator" } }
                }
            },
            "/api/v1/events": {
                "post": {
                    "summary": "A scheduler's job event: submitted, started, finished or cancelled",
                    "description": "Signed (X-Powerplane-Timestamp: Unix seconds; X-Powerplane-Signature: sha256=HMAC-SHA256(key, timestamp + '.' + body) in hex) or with an operator bearer token. Body: {\"event\": \"submitted\", \"scheduler\": \"lsf\", \"job\": \"1234\", \"class\": \"batch\", \"project\": \"p\", \"user\": \"u\", \"gpus\": 2, \"deadline\": \"2030-01-01T00:00:00Z\", \"est_duration_s\": 3600}; see docs/schedulers.md. At most 64 KiB.",
                    "requestBody": { "required": true, "content": { "application/json": {} } },
                    "responses": { "202": { "description": "stored: the job is in the registry" }, "503": { "description": "taken but not stored within ack_wait_s, or too many events waiting; resend" }, "400": { "description": "bad event, with the reason" }, "401": { "description": "unsigned, bad signature, stale timestamp or unknown token" }, "404": { "description": "no [schedulers.webhook] section" }, "413": { "description": "too large" } }
                }
            },
            "/api/v1/k8s/admission": {
                "post": { "summary": "Mutating admission webhook: an AdmissionReview (admission.k8s.io/v1) in, the review with a JSONPatch adding powerplane's scheduling gate to pods of deferrable classes out", "description": "No token (the API server calls it). With [schedulers.kubernetes].", "requestBody": { "required": true, "content": { "application/json": {} } }, "responses": { "200": { "description": "the AdmissionReview response" }, "400": { "description": "not an AdmissionReview" } } }
            },
            "/api/v1/k8s/filter": {
                "post": { "summary": "Scheduler extender filter: ExtenderArgs in, ExtenderFilterResult out; drops nodes in racks over their inlet limit while cooler ones remain", "description": "No token (kube-scheduler calls it).", "requestBody": { "required": true, "content": { "application/json": {} } }, "responses": { "200": { "description": "ExtenderFilterResult" } } }
            },
            "/api/v1/k8s/prioritize": {
                "post": { "summary": "Scheduler extender prioritize: ExtenderArgs in, HostPriorityList (0-10) out; capped and hot nodes score lower", "description": "No token (kube-scheduler calls it).", "requestBody": { "required": true, "content": { "application/json": {} } }, "responses": { "200": { "description": "HostPriorityList" } } }
            },
            "/api/v1/overrides/{id}": {
                "delete": {
                    "summary": "Remove an override", "description": "Needs an operator token.", "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "removed" }, "404": { "description": "no such override" } }
                }
            },
            "/api/v1/grid": get("Demand response: every grid event known (a VTN's, posted, scheduled) with its status, and the one in force as the engine sees it (baseline, target, meter, floor, shortfall, rebound)", "viewer"),
            "/api/v1/grid/targets": {
                "get": { "summary": "The operators' posted grid targets", "description": "Needs a viewer token.", "security": [{ "bearer": [] }], "responses": { "200": { "description": "OK" } } },
                "post": {
                    "summary": "Post a load target at the meter: a shed (percent of the baseline, or kW) or a cap (kW), or a SIMPLE level",
                    "description": "Needs an admin token. Body: {\"duration_min\": 180, \"shed_pct\": 25} with optional \"start\" (RFC 3339; default now), \"id\" (the same id again is a modification) and \"reason\"; exactly one of shed_pct, shed_kw, cap_kw or level.",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": {} } },
                    "responses": { "201": { "description": "posted" }, "400": { "description": "invalid, with the reason" }, "403": { "description": "not an admin" }, "503": { "description": "a follower: post to the leader" } }
                }
            },
            "/api/v1/grid/targets/{id}": {
                "delete": {
                    "summary": "Cancel a posted grid target", "description": "Needs an admin token.", "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "cancelled" }, "404": { "description": "no such target" } }
                }
            },
            "/api/v1/agents": get("The agents: desired, sent, acknowledged and enforced state per GPU; agent health per node", "viewer"),
            "/api/v1/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OK" } } } }
        }
    })
}
