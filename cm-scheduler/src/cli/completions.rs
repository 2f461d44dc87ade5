//! Shell completion scripts: clap's, with two repairs. Its bash script's function names a
//! hyphenated command's subcommands one way and looks them up another, so nothing completed past
//! the first word; they are made to match. And a routine's id or name, which clap cannot know,
//! is completed from the database through the hidden `__complete-routine` command (at most
//! [`NAMES`] names, nothing when the database does not answer, read from `DATABASE_URL` or the
//! default URL).

use std::time::Duration;

use cm_store::PgStore;

use super::out;

/// The most names one completion offers.
pub(super) const NAMES: u32 = 200;

/// How long completing a name may wait for the database before offering nothing.
const DATABASE_WAIT: Duration = Duration::from_secs(2);

/// The `routine` subcommands whose first argument is a routine.
const ROUTINE_ARGUMENT: &str = "show pause resume delete trigger backfill update";

/// The completion script of `shell`, from the command line's definition.
pub(super) fn script(shell: clap_complete::Shell, command: &mut clap::Command) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, command, "cm-scheduler", &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    let script = match shell {
        clap_complete::Shell::Bash => {
            script.replace("cm__subcmd__scheduler", "cm__scheduler") + &bash_names()
        }
        clap_complete::Shell::Zsh => zsh_names(&script),
        clap_complete::Shell::Fish => script + &fish_names(),
        _ => script,
    };
    script.into_bytes()
}

fn bash_names() -> String {
    format!(
        r#"
# Routine names, from the database (`cm-scheduler __complete-routine PREFIX`).
_cm__scheduler_routines() {{
    _cm__scheduler "$@"
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    if [[ "$prev" == --routine || ( "${{COMP_WORDS[1]}}" == routine && $COMP_CWORD -eq 3
          && "$cur" != -* && " {ROUTINE_ARGUMENT} " == *" ${{COMP_WORDS[2]}} "* ) ]]; then
        local name
        COMPREPLY=()
        while IFS= read -r name; do
            COMPREPLY+=("$(printf '%q' "$name")")
        done < <(cm-scheduler __complete-routine "$cur" 2>/dev/null)
    fi
}}
if [[ "${{BASH_VERSINFO[0]}}" -eq 4 && "${{BASH_VERSINFO[1]}}" -ge 4 || "${{BASH_VERSINFO[0]}}" -gt 4 ]]; then
    complete -F _cm__scheduler_routines -o nosort -o bashdefault -o default cm-scheduler
else
    complete -F _cm__scheduler_routines -o bashdefault -o default cm-scheduler
fi
"#
    )
}

fn zsh_names(script: &str) -> String {
    let names = r#"
# Routine names, from the database (`cm-scheduler __complete-routine PREFIX`).
_cm_scheduler_routines() {
    local -a names
    names=("${(@f)$(cm-scheduler __complete-routine "$PREFIX" 2>/dev/null)}")
    compadd -a names
}
"#;
    let script = script
        .replace("id or name:_default'", "id or name:_cm_scheduler_routines'")
        .replace("ID|NAME:_default'", "ID|NAME:_cm_scheduler_routines'");
    // After the `#compdef` line, so the function exists before the script's last lines run.
    match script.split_once('\n') {
        Some((first, rest)) => format!("{first}\n{names}{rest}"),
        None => script,
    }
}

fn fish_names() -> String {
    let names = "(cm-scheduler __complete-routine (commandline -ct) 2>/dev/null)";
    format!(
        "\n# Routine names, from the database (`cm-scheduler __complete-routine PREFIX`).\n\
         complete -c cm-scheduler -n \"__fish_cm_scheduler_using_subcommand routine; and \
         __fish_seen_subcommand_from {ROUTINE_ARGUMENT}\" -f -a \"{names}\"\n\
         complete -c cm-scheduler -n \"__fish_cm_scheduler_using_subcommand fires\" -l routine \
         -r -f -a \"{names}\"\n"
    )
}

/// `__complete-routine PREFIX`: the names of routines starting with `prefix`, one a line;
/// nothing at all when the database cannot say.
pub(super) async fn routine_names(url: &str, prefix: &str) {
    let names = async {
        let store = PgStore::connect_lazy(url).ok()?;
        store.routine_names(prefix, NAMES).await.ok()
    };
    if let Ok(Some(names)) = tokio::time::timeout(DATABASE_WAIT, names).await {
        for name in names {
            out::line(format_args!("{name}"));
        }
    }
}
