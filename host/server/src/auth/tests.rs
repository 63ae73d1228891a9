use super::*;
use sluice_store_sled::{SledOptions, SledStore};

fn request(role: Role) -> TokenRequest {
    TokenRequest {
        role: Some(role),
        ..TokenRequest::default()
    }
}

fn bearer(token: &str) -> Vec<u8> {
    format!("Bearer {token}").into_bytes()
}

fn gate(dir: &std::path::Path, bootstrap: Option<&str>) -> (Arc<SledStore>, Gate) {
    let store = Arc::new(SledStore::reopen(dir, &SledOptions::default()).unwrap());
    let gate = Gate::open(store.clone(), bootstrap.map(token_sha256), false).unwrap();
    (store, gate)
}

#[test]
fn an_open_server_turns_auth_on_with_its_first_admin_token_and_keeps_it_on() {
    let dir = tempfile::tempdir().unwrap();
    let token;
    {
        let (_store, gate) = gate(dir.path(), None);
        assert!(!gate.is_enforced());
        assert_eq!(gate.check(None).unwrap(), Principal::open());
        let refused = gate.issue(request(Role::Viewer), &Principal::open());
        assert!(
            matches!(refused, Err(AuthError::Conflict(_))),
            "{refused:?}"
        );
        let issued = gate
            .issue(request(Role::Admin), &Principal::open())
            .unwrap();
        assert!(issued.token.starts_with(TOKEN_PREFIX));
        assert_eq!(issued.token.len(), TOKEN_PREFIX.len() + 64);
        assert_eq!(issued.record.sha256, token_sha256(&issued.token));
        assert!(gate.is_enforced());
        assert!(matches!(gate.check(None), Err(AuthError::Missing)));
        token = issued.token;
    }
    let (_store, gate) = gate(dir.path(), None);
    assert!(gate.is_enforced());
    let principal = gate.check(Some(&bearer(&token))).unwrap();
    assert_eq!(principal.role, Role::Admin);
    assert!(matches!(
        gate.check(Some(b"Bearer sluice_nope")),
        Err(AuthError::Refused)
    ));
    assert!(matches!(
        gate.check(Some(b"Basic abc")),
        Err(AuthError::Malformed)
    ));
}

#[test]
fn a_revoked_token_is_refused_at_once_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let admin = Principal::admin(BOOTSTRAP_ID);
    let token;
    {
        let (_store, gate) = gate(dir.path(), Some("root-secret"));
        assert!(gate.is_enforced());
        assert_eq!(
            gate.check(Some(&bearer("root-secret"))).unwrap().token_id,
            BOOTSTRAP_ID
        );
        let issued = gate
            .issue(
                TokenRequest {
                    device: Some("scanner-7".into()),
                    tenant: Some("site-a".into()),
                    ..request(Role::Device)
                },
                &admin,
            )
            .unwrap();
        let principal = gate.check(Some(&bearer(&issued.token))).unwrap();
        assert_eq!(principal.device.as_deref(), Some("scanner-7"));
        gate.revoke(&issued.record.id, &admin).unwrap();
        assert!(matches!(
            gate.check(Some(&bearer(&issued.token))),
            Err(AuthError::Refused)
        ));
        token = issued.token;
    }
    let (store, gate) = gate(dir.path(), Some("root-secret"));
    assert!(matches!(
        gate.check(Some(&bearer(&token))),
        Err(AuthError::Refused)
    ));
    let audit = store.audit_after(0, 10).unwrap();
    let actions: Vec<_> = audit.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["token.issue", "token.revoke"]);
    assert!(audit.iter().all(|e| e.token_id == BOOTSTRAP_ID));
}

#[test]
fn the_last_admin_token_cannot_be_revoked_without_a_bootstrap_admin() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, gate) = gate(dir.path(), None);
    let first = gate
        .issue(request(Role::Admin), &Principal::open())
        .unwrap();
    let by = gate.check(Some(&bearer(&first.token))).unwrap();
    assert!(matches!(
        gate.revoke(&first.record.id, &by),
        Err(AuthError::Conflict(_))
    ));
    let second = gate.issue(request(Role::Admin), &by).unwrap();
    gate.revoke(&first.record.id, &by).unwrap();
    assert!(gate.check(Some(&bearer(&second.token))).is_ok());
    assert!(matches!(
        gate.revoke("tok_missing", &by),
        Err(AuthError::NotFound(_))
    ));
}

#[test]
fn requests_are_checked_against_their_role() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, gate) = gate(dir.path(), Some("root"));
    let admin = Principal::admin(BOOTSTRAP_ID);
    let invalid = [
        request(Role::Device),
        TokenRequest {
            worker: Some("gpu-1".into()),
            device: Some("d".into()),
            ..request(Role::Device)
        },
        request(Role::Worker),
        TokenRequest {
            device: Some("d".into()),
            ..request(Role::Viewer)
        },
        TokenRequest {
            device: Some("bad device".into()),
            ..request(Role::Device)
        },
        TokenRequest {
            expires_in_s: Some(0),
            ..request(Role::Admin)
        },
        TokenRequest::default(),
    ];
    for bad in invalid {
        assert!(
            matches!(gate.issue(bad.clone(), &admin), Err(AuthError::Invalid(_))),
            "{bad:?}"
        );
    }
    let worker = gate
        .issue(
            TokenRequest {
                worker: Some("gpu-1".into()),
                expires_in_s: Some(3600),
                ..request(Role::Worker)
            },
            &admin,
        )
        .unwrap();
    let principal = gate.check(Some(&bearer(&worker.token))).unwrap();
    assert!(principal.acts_as_worker("gpu-1"));
    assert!(!principal.acts_as_worker("gpu-2"));
    assert_eq!(principal.actor(), Actor::worker("gpu-1"));
    assert!(worker.record.expires_at_ms.is_some());
}
