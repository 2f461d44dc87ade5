//! The operator's actions on a routine (pause, resume, fire now, edit its settings, delete
//! it): each a form behind a confirmation, carrying the CSRF token; the handler that checks the
//! token, acts and redirects back with a notice of what was done.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cm_store::{Routine, StoreError};
use maud::{Markup, html};

use super::cells::{routine_href, shown};
use super::{
    IndexQuery, StatusPage, missing, not_found, read, refused, status_page, unreadable_address,
};
use crate::edit::{self, Edit};
use crate::http_state::HttpState;
use crate::operations::{self, Change, OperationError, Updated};

/// What the page's actions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Pause,
    Resume,
    Trigger,
    Edit,
    Delete,
}

impl Action {
    const ALL: [Action; 5] = [
        Action::Pause,
        Action::Resume,
        Action::Trigger,
        Action::Edit,
        Action::Delete,
    ];

    fn path(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Trigger => "trigger",
            Action::Edit => "edit",
            Action::Delete => "delete",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Pause => "paused",
            Action::Resume => "resumed",
            Action::Trigger => "triggered",
            Action::Edit => "edited",
            Action::Delete => "deleted",
        }
    }
}

/// `POST /routines/{name or id}/{pause|resume|trigger|edit|delete}`: pauses the routine,
/// resumes it from its next occurrence, asks for one occurrence now (fired by the next tick),
/// changes its settings (checked as `routine update` checks them), or deletes it with its
/// fires.
pub async fn action(
    State(state): State<Arc<HttpState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Bytes,
) -> Response {
    let Ok(Path((handle, action))) = path else {
        return unreadable_address();
    };
    match Action::ALL.into_iter().find(|a| a.path() == action) {
        Some(action) => act(&state, &handle, &body, action).await,
        None => not_found().await,
    }
}

/// `GET` of an action's address: 405, and nothing done (a link or an image cannot act).
pub async fn action_by_get() -> Response {
    let mut response = refused(
        StatusCode::METHOD_NOT_ALLOWED,
        "Nothing was done: an action is a button on the routine's page, never a link.",
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// The second half of the CSRF guard (the first, in `http`, checked the request's origin): the
/// form must carry this process's token. Then the action, and a redirect (303) back to the
/// page it came from, which says what was done (to the index after a delete). An edit that
/// the checks refuse changes nothing and answers 400 with the reason.
async fn act(state: &HttpState, handle: &str, body: &[u8], action: Action) -> Response {
    let status = status_page(state);
    let form: Vec<(String, String)> = url::form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if !field("csrf").is_some_and(|given| status.csrf.matches(given)) {
        return refused(
            StatusCode::FORBIDDEN,
            "This action was refused: its form did not come from this page (reload the page and \
             try again).",
        );
    }
    let routines = &*status.routines;
    let acted = async {
        let routine = operations::find(&*status.reader, handle).await?;
        let outcome = match action {
            Action::Pause => operations::pause(routines, &routine).await?,
            Action::Resume => operations::resume(routines, &routine).await?,
            Action::Trigger => {
                operations::trigger(routines, &routine).await?;
                routine
            }
            Action::Edit => {
                let change = change_of(&routine, &field).map_err(OperationError::Refused)?;
                match operations::update(routines, routine, &change).await? {
                    Updated::Changed(routine) => routine,
                    Updated::Unchanged(routine) => return Ok(Err((routine, "unchanged"))),
                }
            }
            Action::Delete => {
                operations::delete(routines, &routine).await?;
                routine
            }
        };
        Ok(Ok(outcome))
    };
    let (routine, done) = match write(state, handle, acted).await {
        Ok(Ok(routine)) => (routine, action.done()),
        Ok(Err((routine, done))) => (routine, done),
        Err(response) => return response,
    };
    tracing::info!(routine = %routine.name, id = %routine.id, action = done,
        "an operator acted on the status page");
    let back = match action {
        Action::Delete => "/".to_owned(),
        _ => field("back")
            .filter(|b| safe_back(b))
            .map(str::to_owned)
            .unwrap_or_else(|| routine_href(&routine)),
    };
    let location = with_notice(&back, done, &routine.name);
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, location)],
        "done\n",
    )
        .into_response()
}

/// An action's write: [`read`]'s deadline and health, and a refusal (a check, a name taken, a
/// routine gone) answered 400 or 404 with its reason, nothing changed.
async fn write<T>(
    state: &HttpState,
    handle: &str,
    writes: impl Future<Output = Result<T, OperationError>>,
) -> Result<T, Response> {
    match read(state, async {
        match writes.await {
            Err(
                OperationError::Refused(reason)
                | OperationError::Store(StoreError::InvalidRoutine(reason)),
            ) => Ok(Err(reason)),
            Err(OperationError::Store(StoreError::NameTaken(name))) => {
                Ok(Err(format!("the name {name} is taken")))
            }
            Err(OperationError::Store(e)) => Err(e),
            Ok(done) => Ok(Ok(done)),
        }
    })
    .await
    {
        Ok(Ok(Ok(done))) => Ok(done),
        Ok(Ok(Err(reason))) => Err(refused(
            StatusCode::BAD_REQUEST,
            &format!("Nothing was changed: {reason}."),
        )),
        Ok(Err(_)) => Err(missing(handle)),
        Err(response) => Err(response),
    }
}

/// The change an edit form asks of `routine`: each field that differs from the routine's
/// setting (an empty message, number of retries, backoff or key keeps the setting), read by the
/// parsers of `routine update`'s flags and checked by [`operations::update`] as `routine update`
/// checks them. `no_concurrency_key` removes the key, as `--no-concurrency-key` does.
fn change_of<'a>(
    routine: &Routine,
    field: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Change<'a>, String> {
    let changed =
        |name: &str, current: &str| field(name).map(str::trim).filter(|given| *given != current);
    let given = |name: &str| field(name).map(str::trim).filter(|given| !given.is_empty());
    let retries = given("retries")
        .map(edit::retries)
        .transpose()?
        .filter(|n| *n != routine.retry.retries);
    let retry_backoff = given("retry_backoff")
        .map(edit::backoff)
        .transpose()?
        .filter(|b| *b != routine.retry.backoff);
    let key = given("concurrency_key")
        .map(edit::concurrency_key)
        .transpose()?
        .filter(|k| routine.concurrency_key.as_ref() != Some(k));
    let concurrency_key = match (key, field("no_concurrency_key").is_some()) {
        (Some(_), true) => {
            return Err("give a new concurrency key or remove the key, not both".into());
        }
        (Some(key), false) => Some(Some(key)),
        (None, true) => routine.concurrency_key.is_some().then_some(None),
        (None, false) => None,
    };
    Ok(Change {
        edit: Edit {
            name: None,
            schedule: changed("schedule", &routine.schedule),
            timezone: changed("timezone", &routine.timezone),
            misfire: changed("misfire", routine.misfire_policy.as_str()),
            overlap: changed("overlap", routine.overlap.as_str())
                .filter(|_| routine.kind == cm_store::RoutineKind::Mission),
            message: field("message").filter(|m| !m.is_empty()),
        },
        retries,
        retry_backoff,
        concurrency_key,
        overlap_field: "overlap",
        ..Change::default()
    })
}

/// Whether `back` is a path of this server (never another host: no open redirect).
fn safe_back(back: &str) -> bool {
    back.starts_with('/')
        && !back.starts_with("//")
        && !back.contains('\\')
        && back.len() <= 2048
        && !back.chars().any(char::is_control)
}

/// `back` with `done` and `of` set to what was done, replacing earlier ones.
fn with_notice(back: &str, done: &str, name: &str) -> String {
    let (path, query) = back.split_once('?').unwrap_or((back, ""));
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if key != "done" && key != "of" {
            out.append_pair(&key, &value);
        }
    }
    out.append_pair("done", done).append_pair("of", name);
    format!("{path}?{}", out.finish())
}

/// What the last action did, from the query it redirected to.
pub(super) fn notice(query: &IndexQuery) -> Markup {
    let of = shown(query.of.as_deref().unwrap_or(""));
    let said = match query.done.as_deref() {
        Some("paused") => Some(format!("Paused “{of}”: it fires no more until resumed.")),
        Some("resumed") => Some(format!(
            "Resumed “{of}”: it fires from its next occurrence."
        )),
        Some("triggered") => Some(format!(
            "Triggered “{of}”: the next tick fires it (an occurrence at this instant)."
        )),
        Some("edited") => Some(format!(
            "Saved “{of}”: its next run is worked out from the new settings."
        )),
        Some("unchanged") => Some(format!("Nothing to save: “{of}” has these settings.")),
        Some("deleted") => Some(format!("Deleted “{of}” and its fires.")),
        _ => None,
    };
    html! { @if let Some(said) = said { p.notice role="status" { (said) } } }
}

/// A routine's actions, each behind a confirmation (a `<details>` the operator opens, then the
/// form's button), each form carrying the CSRF token and the page to come back to.
pub(super) fn actions(status: &StatusPage, r: &Routine, back: &str) -> Markup {
    let form = |action: Action, summary: &str, confirm: String, class: &str| {
        html! {
            details.act {
                summary { (summary) }
                form method="post" action={ (routine_href(r)) "/" (action.path()) } {
                    input type="hidden" name="csrf" value=(status.csrf.value());
                    input type="hidden" name="back" value=(back);
                    button type="submit" class=(class) { (confirm) }
                }
            }
        }
    };
    html! {
        div.actions {
            @if r.paused {
                (form(Action::Resume, "Resume…", format!("Resume {}", shown(&r.name)), "go"))
            } @else {
                (form(Action::Pause, "Pause…", format!("Pause {}", shown(&r.name)), "danger"))
            }
            @if r.kind == cm_store::RoutineKind::Mission {
                (form(Action::Trigger, "Run again…", format!("Run {} again now", shown(&r.name)), "go"))
            } @else {
                (form(Action::Trigger, "Fire now…", format!("Fire {} now", shown(&r.name)), "go"))
            }
        }
    }
}

/// A routine's settings as a form (behind a `<details>`, as every action): schedule, zone,
/// misfire policy, a mission's overlap policy or a message's new text (empty keeps the text,
/// which the page never shows), retries, retry backoff and concurrency key (empty keeps each;
/// a box removes the key).
pub(super) fn edit_form(status: &StatusPage, r: &Routine, back: &str) -> Markup {
    let mission = r.kind == cm_store::RoutineKind::Mission;
    html! {
        details.act id="edit" {
            summary { "Edit settings…" }
            form.edit method="post" action={ (routine_href(r)) "/edit" } {
                input type="hidden" name="csrf" value=(status.csrf.value());
                input type="hidden" name="back" value=(back);
                label for="edit-schedule" { "Schedule" }
                input id="edit-schedule" name="schedule" value=(r.schedule) required spellcheck="false";
                label for="edit-timezone" { "Time zone" }
                input id="edit-timezone" name="timezone" value=(r.timezone) required spellcheck="false";
                label for="edit-misfire" { "Misfire policy" }
                select id="edit-misfire" name="misfire" {
                    @for policy in ["fire-once", "catch-up", "skip"] {
                        option value=(policy) selected[r.misfire_policy.as_str() == policy] { (policy) }
                    }
                }
                @if mission {
                    label for="edit-overlap" { "Overlap" }
                    select id="edit-overlap" name="overlap" {
                        @for policy in ["forbid", "allow", "replace", "buffer-one", "buffer-all"] {
                            option value=(policy) selected[r.overlap.as_str() == policy] { (policy) }
                        }
                    }
                } @else {
                    label for="edit-message" { "New message" }
                    textarea id="edit-message" name="message" maxlength=(cm_domain::MAX_MESSAGE_BYTES)
                        placeholder="empty keeps the current message (not shown)" {}
                }
                label for="edit-retries" { "Retries" }
                input id="edit-retries" name="retries" value=(r.retry.retries) type="number"
                    min="0" max=(cm_domain::retry::MAX_RETRIES) placeholder="0 is no retry";
                label for="edit-retry-backoff" { "Retry backoff" }
                input id="edit-retry-backoff" name="retry_backoff" value=(r.retry.backoff.to_string())
                    placeholder="BASE..MAX, such as 10s..10m" spellcheck="false";
                label for="edit-concurrency-key" { "Concurrency key" }
                input id="edit-concurrency-key" name="concurrency_key"
                    value=[r.concurrency_key.as_ref().map(|k| k.as_str())]
                    maxlength=(cm_domain::limit::MAX_KEY_CHARS) placeholder="none, such as gpu-pool"
                    spellcheck="false";
                @if r.concurrency_key.is_some() {
                    span {}
                    label { input type="checkbox" name="no_concurrency_key" value="yes"; " Remove its concurrency key (no limit applies to it)" }
                }
                span {}
                button type="submit" class="go" { "Save changes" }
                span.hint.muted.small { "Checked as routine update checks it; left empty, retries, backoff and key keep theirs; a new schedule or zone moves the next run." }
            }
        }
    }
}

/// Delete, behind a confirmation that says how many fires go with the routine.
pub(super) fn delete_form(status: &StatusPage, r: &Routine, fire_count: u64) -> Markup {
    let fires = match fire_count {
        0 => "no fires".to_owned(),
        1 => "its one fire".to_owned(),
        n => format!("its {n} fires"),
    };
    html! {
        details.act id="delete" {
            summary { "Delete…" }
            form method="post" action={ (routine_href(r)) "/delete" } {
                input type="hidden" name="csrf" value=(status.csrf.value());
                p.small { "Deletes the routine and " (fires) " from the ledger; a run already going is not stopped by this page." }
                button type="submit" class="danger" { "Delete " (shown(&r.name)) " and " (fires) }
            }
        }
    }
}
