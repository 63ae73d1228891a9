//! `sqlx::migrate!` embeds the migrations at compile time, but on stable Rust it cannot tell
//! cargo to watch them: without this a new migration alone would not be built in.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
