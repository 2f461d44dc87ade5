//! This scheduler's figures (in flight, the outbox backlog, ticks, fires, lateness), the fires
//! and failures per minute of the last hour drawn as SVG on the server, and the strips of a
//! routine's last fires.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cm_store::{FireRate, OpenClaims, OutboxBacklog, RecentFire};
use maud::{Markup, PreEscaped, html};

use super::cells::{outcome_class, page_outcome_text, relative, shown, utc};
use crate::counters::Stats;
use crate::http_state::HttpState;

/// This scheduler's own figures, with everyone's open claims and the outbox backlog when read.
pub(super) fn figures(
    state: &HttpState,
    claims: Option<OpenClaims>,
    outbox: Option<&OutboxBacklog>,
    now: DateTime<Utc>,
) -> Markup {
    let stats = &state.stats;
    let last_tick = match stats.last_success() {
        Some(at) => format!("{}s ago", at.elapsed().as_secs()),
        None => "none yet".into(),
    };
    let lateness = match stats.lateness.mean() {
        Some(mean) => format!(
            "{} mean, {} max",
            seconds(mean),
            seconds(stats.lateness.max())
        ),
        None => "no dispatch yet".into(),
    };
    html! {
        div.figures id="figures" {
            div.figure { "In flight (this / all)" b {
                @match claims { Some(c) => { (c.mine) " / " (c.all) } None => "?" }
            } }
            div.figure title="outbox messages no consumer has acknowledged" { "Outbox backlog" b {
                @match outbox {
                    Some(o) => {
                        (o.pending)
                        @if let Some(oldest) = o.oldest { " " span.muted.small { "oldest " (relative(oldest, now)) } }
                    }
                    None => "?",
                }
            } }
            div.figure { "Last good tick" b { (last_tick) } }
            div.figure { "Ticks" b { (Stats::get(&stats.ticks)) } }
            div.figure { "Tick errors" b { (Stats::get(&stats.tick_errors)) } }
            div.figure title="messages this scheduler delivered since it started (the chart below counts every scheduler's fires)" { "Fired here" b { (Stats::get(&stats.fired)) } }
            div.figure title="missions this scheduler launched whose run succeeded, since it started" { "Missions succeeded here" b { (Stats::get(&stats.succeeded)) } }
            div.figure title="this scheduler's failed dispatches, and missions whose run failed or was lost, since it started" { "Failed here" b { (Stats::get(&stats.failed) + Stats::get(&stats.lost)) } }
            div.figure { "Deferred" b { (Stats::get(&stats.deferred)) } }
            div.figure { "Lateness" b { (lateness) } }
        }
        @if let Some(error) = stats.last_error() {
            p { "Latest loop error: " span.error.failed { (shown(&error)) } }
        }
    }
}

/// A strip of fires, oldest left, one coloured cell each (by its outcome: a mission's is its
/// run's), its time, outcome and error its title.
pub(super) fn strip(fires: &[RecentFire]) -> Markup {
    html! {
        span.strip role="img" aria-label=(strip_label(fires)) {
            @for f in fires.iter().rev() {
                @let outcome = f.outcome();
                @let word = page_outcome_text(outcome, &f.status, f.run_exit_code);
                @let title = match &f.error {
                    Some(error) => format!("{} {word}: {error}", utc(f.scheduled_at)),
                    None => format!("{} {word}", utc(f.scheduled_at)),
                };
                span class={ "cell " (outcome_class(outcome)) } title=(title) {}
            }
        }
    }
}

fn strip_label(fires: &[RecentFire]) -> String {
    let count = |class: &str| {
        fires
            .iter()
            .filter(|f| outcome_class(f.outcome()) == class)
            .count()
    };
    format!(
        "last {} fires: {} fired or succeeded, {} failed, {} skipped, {} running",
        fires.len(),
        count("fired"),
        count("failed"),
        count("skipped"),
        count("claimed")
    )
}

/// Fires and failures per minute over the last hour, as stacked bars drawn on the server.
pub(super) fn rate_chart(rate: &FireRate) -> Markup {
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 130.0;
    const LEFT: f64 = 34.0;
    const BOTTOM: f64 = 18.0;
    const TOP: f64 = 6.0;
    let peak = rate
        .minutes
        .iter()
        .map(|m| m.fired + m.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let (fired, failed): (u64, u64) = rate
        .minutes
        .iter()
        .fold((0, 0), |(a, b), m| (a + m.fired, b + m.failed));
    let plot = HEIGHT - BOTTOM - TOP;
    let slot = (WIDTH - LEFT) / rate.minutes.len().max(1) as f64;
    let scale = |n: u64| n as f64 / peak as f64 * plot;
    let mut bars = String::new();
    let minutes = rate.minutes.len() as i64;
    for (i, m) in rate.minutes.iter().enumerate() {
        let x = LEFT + i as f64 * slot + 0.5;
        let start = rate.until - chrono::Duration::minutes(minutes - 1 - i as i64);
        let label = format!(
            "{}: {} fired, {} failed",
            start.format("%H:%M UTC"),
            m.fired,
            m.failed
        );
        let (h_fired, h_failed) = (scale(m.fired), scale(m.failed));
        let base = HEIGHT - BOTTOM;
        let _ = write!(
            bars,
            r##"<g><title>{label}</title><rect x="{x:.1}" y="{top:.1}" width="{w:.1}" height="{plot:.1}" fill="transparent"/>"##,
            top = TOP,
            w = slot - 1.0,
        );
        if m.fired > 0 {
            let _ = write!(
                bars,
                r##"<rect class="fired" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h_fired:.1}" fill="#2da44e"/>"##,
                y = base - h_fired,
                w = slot - 1.0,
            );
        }
        if m.failed > 0 {
            let _ = write!(
                bars,
                r##"<rect class="failed" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h_failed:.1}" fill="#cf222e"/>"##,
                y = base - h_fired - h_failed,
                w = slot - 1.0,
            );
        }
        bars.push_str("</g>");
    }
    let axis = HEIGHT - BOTTOM;
    html! {
        p.legend.small {
            span { span.cell.fired {} (fired) " fired or succeeded" }
            span { span.cell.failed {} (failed) " failed or lost" }
            span.muted { "by every scheduler in the last hour, by occurrence time; busiest minute " (peak) }
        }
        svg.chart id="fire-rate" xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            role="img" aria-label={ "fires per minute over the last hour: " (fired) " fired, " (failed) " failed" } {
            line x1=(LEFT) y1=(axis) x2=(WIDTH) y2=(axis) stroke="#d0d7de" {}
            line x1=(LEFT) y1=(TOP) x2=(WIDTH) y2=(TOP) stroke="#eaeef2" stroke-dasharray="3 3" {}
            text x=(LEFT - 4.0) y=(TOP + 9.0) text-anchor="end" { (peak) }
            text x=(LEFT - 4.0) y=(axis) text-anchor="end" { "0" }
            (PreEscaped(bars))
            text x=(LEFT) y=(HEIGHT - 4.0) { "60 min ago" }
            text x=(LEFT + (WIDTH - LEFT) / 2.0) y=(HEIGHT - 4.0) text-anchor="middle" { "30 min ago" }
            text x=(WIDTH) y=(HEIGHT - 4.0) text-anchor="end" { "now" }
        }
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
