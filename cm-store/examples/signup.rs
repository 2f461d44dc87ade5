//! A sibling service that keeps a user and that user's daily digest together: `POST /users`
//! inserts the user's row and the user's routine in one transaction, so a failure anywhere
//! (a name taken, a bad address, the database gone) leaves neither, and a success leaves both.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/signup cargo run -p cm-store --example signup
//! curl -s -XPOST localhost:3000/users -H 'content-type: application/json' \
//!      -d '{"email": "ada@example.com", "timezone": "Europe/Berlin", "hour": 9}'
//! ```
//!
//! A scheduler on the same database (`cm-scheduler run`) then fires the digest every day at
//! 09:00 in Berlin. `cargo test -p cm-store --example signup` runs the tests below against the
//! PostgreSQL `DATABASE_URL` names.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use cm_domain::{MisfirePolicy, Schedule};
use cm_store::{NewRoutine, PgStore, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::PgPool;

/// The service's own table: an address must look like one (a `CHECK` the database enforces,
/// after the routine was written in the same transaction).
const USERS: &str = "CREATE TABLE IF NOT EXISTS users (
    id BIGSERIAL PRIMARY KEY,
    email TEXT NOT NULL UNIQUE CHECK (email LIKE '%_@_%'),
    digest UUID NOT NULL
)";

/// What `POST /users` takes.
#[derive(Debug, Deserialize)]
struct SignUp {
    email: String,
    timezone: String,
    hour: u8,
}

/// The router: `POST /users`.
fn app(pool: PgPool) -> Router {
    Router::new()
        .route("/users", post(sign_up))
        .with_state(pool)
}

/// Checks the request with cm-domain (nothing is written for a bad zone or hour), then writes
/// the routine and the user in one transaction.
async fn sign_up(State(pool): State<PgPool>, body: Bytes) -> Response {
    let answer = |code: StatusCode, body: Value| {
        (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    };
    let refuse = |code: StatusCode, error: String| answer(code, json!({ "error": error }));
    let body: SignUp = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let schedule = match Schedule::parse(&format!("0 {} * * *", body.hour), &body.timezone) {
        Ok(schedule) => schedule,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // Checked whole here, as `routine create` checks it: a refusal is the domain's one line.
    let digest = match NewRoutine::message(
        format!("digest for {}", body.email),
        schedule,
        &format!("Good morning, {}: here is your digest.", body.email),
    )
    .misfire(MisfirePolicy::FireOnce)
    .build()
    {
        Ok(digest) => digest,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let written = async {
        let mut tx = pool.begin().await?;
        let routine = cm_store::tx::create_routine(&mut tx, &digest).await?;
        let user: i64 =
            sqlx::query_scalar("INSERT INTO users (email, digest) VALUES ($1, $2) RETURNING id")
                .bind(&body.email)
                .bind(routine.id)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok::<_, StoreError>((user, routine))
    };
    match written.await {
        Ok((user, routine)) => answer(
            StatusCode::CREATED,
            json!({ "user": user, "digest": routine.id, "first": routine.next_run_at }),
        ),
        Err(StoreError::NameTaken(name)) => refuse(StatusCode::CONFLICT, format!("{name} exists")),
        Err(StoreError::Database(e))
            if e.as_database_error()
                .is_some_and(|d| d.is_check_violation()) =>
        {
            refuse(StatusCode::BAD_REQUEST, "not an email address".into())
        }
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")?;
    let store = PgStore::connect(&url).await?;
    store.migrate().await?;
    let pool = PgPool::connect(&url).await?;
    sqlx::query(USERS).execute(&pool).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(pool)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    async fn post_user(pool: &PgPool, body: Value) -> (StatusCode, Value) {
        let request = Request::post("/users")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let response = app(pool.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn count(pool: &PgPool, table: &str) -> i64 {
        let sql = match table {
            "users" => "SELECT count(*) FROM users",
            _ => "SELECT count(*) FROM cm.routines",
        };
        sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
    }

    /// A sign-up writes both rows; one whose user insert fails after its routine was written
    /// (the address fails the table's check) leaves neither; a second sign-up of the address
    /// is refused at its routine's name and leaves the first as it was.
    #[sqlx::test(migrator = "cm_store::MIGRATOR")]
    async fn a_user_and_their_digest_commit_together_or_not_at_all(pool: PgPool) {
        sqlx::query(USERS).execute(&pool).await.unwrap();
        let ada = json!({ "email": "ada@example.com", "timezone": "Europe/Berlin", "hour": 9 });
        let (status, body) = post_user(&pool, ada.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(body["first"].is_string(), "{body}");
        assert_eq!(
            (count(&pool, "users").await, count(&pool, "routines").await),
            (1, 1)
        );

        // The routine is written, then the user's insert fails: the transaction rolls back
        // both.
        let (status, body) = post_user(
            &pool,
            json!({ "email": "not-an-address", "timezone": "UTC", "hour": 7 }),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM cm.routines WHERE name = 'digest for not-an-address'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0, "the routine outlived its user's failed insert");
        assert_eq!(
            (count(&pool, "users").await, count(&pool, "routines").await),
            (1, 1)
        );

        let (status, body) = post_user(&pool, ada).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        let (status, body) = post_user(
            &pool,
            json!({ "email": "grace@example.com", "timezone": "Mars/Olympus", "hour": 9 }),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            (count(&pool, "users").await, count(&pool, "routines").await),
            (1, 1)
        );
    }
}
