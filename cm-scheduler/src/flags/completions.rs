//! Shell completion scripts: clap's, with these repairs. Its bash script's function names a
//! hyphenated command's subcommands one way and looks them up another, so nothing completed past
//! the first word; they are made to match. And a routine's id or name, which clap cannot know,
//! is completed from the database through the hidden `__complete-routine` command (at most
//! [`NAMES`] names, nothing when the database does not answer, read from the database flags typed
//! on the line, else `DATABASE_URL` or the default URL), quoted as each shell needs (names
//! derived from crontab lines hold `:`, `=`, `*` and spaces). The internal subcommand itself is
//! never offered.

/// The most names one completion offers.
pub const NAMES: u32 = 200;

/// The `routine` subcommands whose first argument is a routine.
const ROUTINE_ARGUMENT: &str = "show pause resume delete trigger backfill update";

/// The completion script of `shell`, from the command line's definition.
pub fn script(shell: clap_complete::Shell, command: &mut clap::Command) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, command, "cm-scheduler", &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    let script = match shell {
        clap_complete::Shell::Bash => {
            // clap offers hidden subcommands in bash's word lists; the internal one is left out.
            script
                .replace("cm__subcmd__scheduler", "cm__scheduler")
                .replace(" __complete-routine help\"", " help\"")
                + &bash_names()
        }
        clap_complete::Shell::Zsh => zsh_names(&without_lines(&script, "'__complete-routine:")),
        clap_complete::Shell::Fish => {
            without_lines(&script, "-f -a \"__complete-routine\"") + &fish_names()
        }
        _ => script,
    };
    script.into_bytes()
}

/// `script` without the lines containing `needle` (the internal subcommand's offers).
fn without_lines(script: &str, needle: &str) -> String {
    script
        .split_inclusive('\n')
        .filter(|line| !line.contains(needle))
        .collect()
}

/// Bash splits a word at `:` and `=` (`COMP_WORDBREAKS`), so a crontab-derived name such as
/// `backup.cron: 0 3 * * * /usr/bin/backup` reached the completion in pieces and the flags were
/// offered instead. The words are read again from the line up to the cursor, split at unquoted
/// blanks only; each name is offered as the rest of the piece bash replaces, quoted with
/// `printf %q`. The global flags typed before the subcommand are skipped to find it, and the
/// database flags among them are passed to the lookup.
fn bash_names() -> String {
    format!(
        r#"
# Routine names, from the database (`cm-scheduler __complete-routine PREFIX`).
_cm__scheduler_line_words() {{
    local line="${{COMP_LINE:0:$COMP_POINT}}" word="" quote="" c i
    _cm__scheduler_words=()
    for (( i = 0; i < ${{#line}}; i++ )); do
        c="${{line:i:1}}"
        if [[ -n "$quote" ]]; then
            if [[ "$c" == "$quote" ]]; then quote=""; else word+="$c"; fi
        elif [[ "$c" == "\\" ]]; then
            (( i++ ))
            word+="${{line:i:1}}"
        elif [[ "$c" == "'" || "$c" == '"' ]]; then
            quote="$c"
        elif [[ "$c" == " " || "$c" == $'\t' ]]; then
            [[ -n "$word" ]] && _cm__scheduler_words+=("$word")
            word=""
        else
            word+="$c"
        fi
    done
    _cm__scheduler_words+=("$word")
}}
_cm__scheduler_routines() {{
    _cm__scheduler "$@"
    _cm__scheduler_line_words
    local -a w=("${{_cm__scheduler_words[@]}}") globals=()
    local n=${{#w[@]}} i=1
    local cur="${{w[n-1]}}" prev="${{w[n-2]}}"
    while (( i < n - 1 )); do
        case "${{w[i]}}" in
            --database-url|--database-url-file) globals+=("${{w[i]}}" "${{w[i+1]}}"); (( i += 2 )) ;;
            --database-url=*|--database-url-file=*) globals+=("${{w[i]}}"); (( i++ )) ;;
            *) break ;;
        esac
    done
    if [[ "$prev" == --routine || ( "${{w[i]}}" == routine && $(( n - 1 )) -eq $(( i + 2 ))
          && "$cur" != -* && " {ROUTINE_ARGUMENT} " == *" ${{w[i+1]}} "* ) ]]; then
        # Readline replaces only the text after the word's last `:` or `=`.
        local name keep=""
        [[ "$cur" == *[:=]* ]] && keep="${{cur%"${{cur##*[:=]}}"}}"
        COMPREPLY=()
        while IFS= read -r name; do
            COMPREPLY+=("$(printf '%q' "${{name#"$keep"}}")")
        done < <(cm-scheduler "${{globals[@]}}" __complete-routine "$cur" 2>/dev/null)
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

/// zsh quotes what `compadd` offers itself; the database flags typed anywhere on the line
/// (`$BUFFER`, split as the shell splits it) are passed to the lookup.
fn zsh_names(script: &str) -> String {
    let names = r#"
# Routine names, from the database (`cm-scheduler __complete-routine PREFIX`).
_cm_scheduler_routines() {
    local -a names words_ globals
    local i
    words_=("${(@Q)${(z)BUFFER}}")
    for (( i = 1; i <= ${#words_}; i++ )); do
        case "${words_[i]}" in
            --database-url|--database-url-file) globals+=("${words_[i]}" "${words_[i+1]}") ;;
            --database-url=*|--database-url-file=*) globals+=("${words_[i]}") ;;
        esac
    done
    names=("${(@f)$(cm-scheduler "${globals[@]}" __complete-routine "$PREFIX" 2>/dev/null)}")
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

/// fish escapes what it offers itself; the database flags typed before the cursor
/// (`commandline -opc`, unescaped tokens) are passed to the lookup, with the current token
/// unescaped as the prefix.
fn fish_names() -> String {
    let names = "(__cm_scheduler_routines)";
    format!(
        "\n# Routine names, from the database (`cm-scheduler __complete-routine PREFIX`).\n\
         function __cm_scheduler_routines\n\
         \x20   set -l tokens (commandline -opc)\n\
         \x20   set -l globals\n\
         \x20   for i in (seq (count $tokens))\n\
         \x20       switch $tokens[$i]\n\
         \x20           case --database-url --database-url-file\n\
         \x20               set -a globals $tokens[$i] $tokens[(math $i + 1)]\n\
         \x20           case '--database-url=*' '--database-url-file=*'\n\
         \x20               set -a globals $tokens[$i]\n\
         \x20       end\n\
         \x20   end\n\
         \x20   cm-scheduler $globals __complete-routine (commandline -ct | string unescape) 2>/dev/null\n\
         end\n\
         complete -c cm-scheduler -n \"__fish_cm_scheduler_using_subcommand routine; and \
         __fish_seen_subcommand_from {ROUTINE_ARGUMENT}\" -f -a \"{names}\"\n\
         complete -c cm-scheduler -n \"__fish_cm_scheduler_using_subcommand fires\" -l routine \
         -r -f -a \"{names}\"\n"
    )
}
