//! Another service creating a routine with `cm-store` alone: validate the schedule with
//! `cm-domain`, store the routine, print its id and first run.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/cm cargo run -p cm-store --example create_routine
//! ```

use cm_domain::Schedule;
use cm_store::{NewRoutine, PgStore, RoutineKind, RoutineStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/cm".into());
    // A bad expression or zone is refused here, before anything is written.
    let schedule = Schedule::parse("0 9 * * MON-FRI", "Europe/Berlin")?;
    PgStore::create_database_if_missing(&url).await?;
    let store = PgStore::connect(&url).await?;
    store.migrate().await?;
    let routine = store
        .create_routine(
            NewRoutine::builder(
                "weekday standup reminder",
                schedule,
                RoutineKind::Message,
                serde_json::json!({ "text": "standup in 5 minutes" }),
            )
            .build()?,
        )
        .await?;
    println!("{} first runs at {:?}", routine.id, routine.next_run_at);
    Ok(())
}
