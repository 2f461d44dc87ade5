//! cm-domain's integration tests, one binary (`autotests = false` in the manifest): an index of
//! the modules below, one line each saying what the module proves.

// A schedule's checks look at no more candidates than their budget; costlier ones are refused.
mod calendar_properties;
mod check_budget;
// Jitter: ticks owe exactly what `runs_from_clock` lists, once, offsets inside the jitter.
mod jitter_properties;
// The claim protocol's invariants hold after every step of schedulers that crash at any step.
mod model;
// The repository host check against the system's resolver, over every notation and URL form.
mod repository_hosts;
// Windows and exclusions: `next_after` walks exactly the rule's occurrences an oracle keeps.
mod rules_properties;
// Quartz's `L`, `W` and `#`: a year of `next_after` against a day-by-day reference.
mod quartz_properties;
// RFC 5545 rules: ticks owe what the cron line saying the same lists; walks match the crate's.
mod rrule_properties;
// `next_after` against a brute-force oracle, over generated expressions and zones.
mod schedule_properties;
// The worked DST vectors in `data/`, every one chained through `next_after`.
mod schedules;
// `in_words`: any valid schedule reads as one line ending with its zone and calendar.
mod words_properties;
