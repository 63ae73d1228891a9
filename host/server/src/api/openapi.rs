//! The OpenAPI 3.1 document of the API, served at `/v1/openapi.json`. The routes are mounted
//! from the same `#[utoipa::path]` annotations the document is made of (see `router`), so a
//! route cannot be served without being documented; this module adds what every operation
//! shares: the bearer security scheme and the problem answer.

use super::problem::{PROBLEM_JSON, Problem};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, RefOr};
use utoipa::{OpenApi as _, PartialSchema as _};

/// The security scheme's name in the document.
pub const BEARER: &str = "bearer";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Sluice",
        description = "A durable task scheduler between devices that submit work and GPU inference workers that pull it. Every request but the liveness probe carries `Authorization: Bearer TOKEN` once auth is on; every error is `application/problem+json` (RFC 9457).",
        license(name = "Apache-2.0")
    ),
    components(schemas(Problem)),
    tags(
        (name = "tasks", description = "Submitting, reading and cancelling tasks"),
        (name = "workers", description = "Heartbeats, claims and reports of workers"),
        (name = "policies", description = "Policy components: upload, activate, roll back"),
        (name = "access", description = "Tokens and the audit log"),
        (name = "experiments", description = "Live A/B and shadow experiments of policy versions, and their reports"),
        (name = "operations", description = "Probes, counters, metrics and the event log"),
    )
)]
struct Base;

/// The document's shell, before the routes add their paths.
pub fn base() -> OpenApi {
    Base::openapi()
}

/// The document as served: `finish`ed, with flattened members inlined (see `inline_flattened`).
pub fn document(mut doc: OpenApi) -> Result<serde_json::Value, serde_json::Error> {
    finish(&mut doc);
    let mut json = serde_json::to_value(&doc)?;
    inline_flattened(&mut json);
    name_operations(&mut json);
    link_created_ids(&mut json);
    Ok(json)
}

/// Operation ids from method and path (`get_v1_tasks_id_events`): the handlers' names repeat
/// across modules (`list`, `events`), and an id must be unique in the document.
fn name_operations(json: &mut serde_json::Value) {
    let Some(paths) = json["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            let words: Vec<String> = path
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|word| !word.is_empty())
                .map(str::to_owned)
                .collect();
            operation["operationId"] = format!("{method}_{}", words.join("_")).into();
        }
    }
}

/// Links from the answers that make a task or a token to the operations that take its id, so
/// a client (or a stateful fuzzer) can follow them.
fn link_created_ids(json: &mut serde_json::Value) {
    let task_operations = [
        ("get", "/v1/tasks/{id}"),
        ("get", "/v1/tasks/{id}/events"),
        ("post", "/v1/tasks/{id}/cancel"),
    ];
    let links: serde_json::Map<String, serde_json::Value> = task_operations
        .iter()
        .map(|(method, path)| {
            let id = format!(
                "{method}_{}",
                path.split(|c: char| !c.is_ascii_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .collect::<Vec<_>>()
                    .join("_")
            );
            (
                id.clone(),
                serde_json::json!({"operationId": id, "parameters": {"id": "$response.body#/id"}}),
            )
        })
        .collect();
    for status in ["200", "201"] {
        let response = &mut json["paths"]["/v1/tasks"]["post"]["responses"][status];
        if response.is_object() {
            response["links"] = serde_json::Value::Object(links.clone());
        }
    }
    let revoke = &mut json["paths"]["/v1/tokens"]["post"]["responses"]["201"];
    if revoke.is_object() {
        revoke["links"] = serde_json::json!({
            "delete_v1_tokens_id": {
                "operationId": "delete_v1_tokens_id",
                "parameters": {"id": "$response.body#/id"},
            }
        });
    }
}

/// A struct flattened into another (`#[serde(flatten)]`) is an `allOf` member in the
/// document; when the member refuses unknown fields as a request body
/// (`additionalProperties: false`), that would refuse the outer struct's own fields too. Such
/// members are inlined there without the refusal; the request body keeps it.
fn inline_flattened(json: &mut serde_json::Value) {
    let schemas = json["components"]["schemas"].clone();
    let strict =
        |name: &str| schemas[name]["additionalProperties"] == serde_json::Value::Bool(false);
    fn walk(value: &mut serde_json::Value, fix: &dyn Fn(&mut serde_json::Value)) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Array(members)) = map.get_mut("allOf") {
                    members.iter_mut().for_each(fix);
                }
                map.values_mut().for_each(|v| walk(v, fix));
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| walk(v, fix)),
            _ => {}
        }
    }
    let fix = |member: &mut serde_json::Value| {
        let Some(name) = member["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .map(str::to_owned)
        else {
            return;
        };
        if strict(&name) {
            let mut inlined = schemas[name.as_str()].clone();
            if let Some(map) = inlined.as_object_mut() {
                map.remove("additionalProperties");
            }
            *member = inlined;
        }
    };
    walk(json, &fix);
}

/// Adds what every operation shares: the bearer scheme (required unless an operation says
/// otherwise) and a `default` answer of `Problem` for every error an operation does not list.
fn finish(doc: &mut OpenApi) {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token from `POST /v1/tokens` or the bootstrap admin's",
                ))
                .build(),
        ),
    );
    doc.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    let problem = ResponseBuilder::new()
        .description("An error, as RFC 9457 problem details")
        .content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Problem::schema()))
                .build(),
        )
        .build();
    for item in doc.paths.paths.values_mut() {
        for operation in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
        ]
        .into_iter()
        .flatten()
        {
            operation
                .responses
                .responses
                .entry("default".to_owned())
                .or_insert_with(|| RefOr::T(problem.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_holds_every_route_with_the_problem_answer_and_the_scheme() {
        let (_, doc) = super::super::documented_routes().split_for_parts();
        let json = document(doc).unwrap();
        assert_eq!(json["openapi"], "3.1.0");
        let paths = json["paths"].as_object().unwrap();
        for path in [
            "/healthz",
            "/v1/tasks",
            "/v1/tasks/{id}",
            "/v1/tasks/{id}/complete",
            "/v1/workers/{id}/claim",
            "/v1/policies/{kind}",
            "/v1/tokens/{id}",
            "/v1/audit",
        ] {
            assert!(paths.contains_key(path), "{path} is not documented");
        }
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                assert!(
                    operation["responses"]["default"].is_object(),
                    "{method} {path} has no problem answer"
                );
            }
        }
        assert_eq!(
            json["components"]["securitySchemes"][BEARER]["scheme"],
            "bearer"
        );
        // The heartbeat refuses unknown fields as a request, and is flattened into the
        // worker's view as an answer: the view must not refuse its own fields.
        assert_eq!(
            json["components"]["schemas"]["Heartbeat"]["additionalProperties"],
            false
        );
        let view = &json["components"]["schemas"]["WorkerView"];
        let members = view["allOf"].as_array().unwrap();
        assert!(
            members
                .iter()
                .all(|m| m.get("additionalProperties").is_none())
        );
    }
}
