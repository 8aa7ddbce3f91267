//! byo-db's integration tests: one binary (each costs a link of most of the workspace), one
//! module per topic. `scripts/test` runs each topic in a process of its own (`<topic>::`),
//! scheduled across two lanes by measured duration; `cargo test --test it` runs them all
//! in one.

/// Generates `<scenario>::sqlite` and `<scenario>::postgres` tests for each scenario (the
/// PostgreSQL half whenever the test command started one; always under CI).
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(byo_db::testing::sqlite().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(db) = byo_db::testing::postgres().await {
                    super::$name(db).await
                }
            }
        }
    )*};
}

mod api_tokens;
mod conformance;
mod invoices;
mod notices;
mod releases;
