//! The default policy components, built from `policies/` by the build script and embedded.

include!(concat!(env!("OUT_DIR"), "/default_policies.rs"));
