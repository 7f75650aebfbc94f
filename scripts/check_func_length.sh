#!/usr/bin/env bash
# Function-length check: measures every function definition of the production C code (the folders
# autograd, tokenizer, datasets, layers, export and src; tests/, tests/fuzz/ and bench/ are not
# checked) and fails on any longer than the limit, 120 lines unless told.
#
# House style makes a definition easy to find without a C parser: it starts at column 0 (the line
# with the return type, possibly `static`, or the name itself), its signature may run over several
# lines and opens the body with `{` (on the signature's last line or alone on the next), and the body
# ends with the first `}` at column 0. A one-line function (`int f(void) { return 0; }`) is one line
# long. A block at column 0 whose head has `=` outside parentheses (an initialised table) or no
# parenthesis at all (struct, union, enum) is not a function. Comments, preprocessor lines and their
# continuations are skipped. The length counts from the first line of the signature to the closing
# `}` inclusive, comments and blank lines in the body included.
#
# Where Universal Ctags is installed the script also compares, file by file, the functions it found
# with the ones ctags finds, and fails (exit 2) on any difference, so a definition the column-0
# heuristic misses cannot pass unmeasured.
#
# Usage: scripts/check_func_length.sh [-l] [-w WARN] [-a ALLOW_FILE] [LIMIT [ROOT]]
#   -l          list every function as FILE:LINE: FUNC N, longest first
#   -w WARN     also list the functions over WARN lines (and within LIMIT), without failing
#   -a FILE     allow list (default scripts/func_length_allow.txt): lines FILE:FUNC (e.g.
#               src/cli/cmd_bench.c:bq_cmd_bench), '#' starts a comment; a listed function over the
#               limit is reported as "allowed for now" and does not fail the check
#   LIMIT       the most lines a function may have (default 120)
#   ROOT        the checkout (default: the one containing this script)
# Prints FILE:LINE: FUNC is N lines (limit LIMIT) on stderr for each function over the limit and
# exits 1 if there is any that the allow list does not name; exits 2 on a usage error or when ctags
# disagrees with the heuristic.
set -u

list=0
warn=0
allow=""
while getopts "lw:a:" opt; do
    case "$opt" in
        l) list=1 ;;
        w) warn=$OPTARG ;;
        a) allow=$OPTARG ;;
        *) echo "usage: $0 [-l] [-w WARN] [-a ALLOW_FILE] [LIMIT [ROOT]]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
limit=${1:-120}
root=${2:-"$(cd "$(dirname "$0")/.." && pwd)"}
case "$limit$warn" in
    *[!0-9]*) echo "check_func_length: LIMIT and WARN must be whole numbers" >&2; exit 2 ;;
esac
if [ -n "$allow" ] && [ "${allow#/}" = "$allow" ]; then allow=$PWD/$allow; fi
cd "$root" || exit 2
allow=${allow:-scripts/func_length_allow.txt}
if [ ! -f "$allow" ]; then
    [ "$allow" = scripts/func_length_allow.txt ] || { echo "check_func_length: no allow list $allow" >&2; exit 2; }
    allow=/dev/null
fi

folders=(autograd tokenizer datasets layers export src)
files=()
while IFS= read -r f; do files+=("$f"); done < <(find "${folders[@]}" -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null | LC_ALL=C sort)
if [ "${#files[@]}" = 0 ]; then
    echo "check_func_length: no C files under ${folders[*]} in $root" >&2
    exit 2
fi

# One line per definition: FILE<TAB>LINE<TAB>FUNC<TAB>LENGTH.
measure() {
    awk '
    function reset_head() { head = ""; head_line = 0 }
    # The function name: the first identifier followed by "(" that is neither an attribute nor the
    # return type of a function returning a pointer to function, as in int (*name(args))(int), where
    # the "(" after the type opens with "*"; "" when the head is not a function (no such identifier,
    # or an "=" outside parentheses, which makes it an initialised variable).
    function func_name(h,    i, c, depth, name, id, rest) {
        depth = 0; name = ""
        for (i = 1; i <= length(h); i++) {
            c = substr(h, i, 1)
            if (c == "(") {
                if (name == "") {
                    id = substr(h, 1, i - 1)
                    rest = substr(h, i + 1)
                    sub(/[ \t]+$/, "", id)
                    if (match(id, /[A-Za-z_][A-Za-z0-9_]*$/) && rest !~ /^[ \t]*\*/) {
                        id = substr(id, RSTART)
                        if (id != "__attribute__" && id != "__declspec" && id != "_Alignas") name = id
                    }
                }
                depth++
            } else if (c == ")") depth--
            else if (c == "=" && depth == 0) return ""
        }
        return name
    }
    # Removes comments, string and character literals from line s, carrying an open block comment
    # over to the next line in in_comment.
    function strip(s,    out, i, c, n, q) {
        out = ""; n = length(s); i = 1
        while (i <= n) {
            c = substr(s, i, 1)
            if (in_comment) {
                if (substr(s, i, 2) == "*/") { in_comment = 0; i += 2 } else i++
                continue
            }
            if (substr(s, i, 2) == "/*") { in_comment = 1; i += 2; out = out " "; continue }
            if (substr(s, i, 2) == "//") break
            if (c == "\"" || c == "\047") {
                q = c; i++
                while (i <= n && substr(s, i, 1) != q) { if (substr(s, i, 1) == "\\") i++; i++ }
                i++; out = out q q
                continue
            }
            out = out c; i++
        }
        return out
    }
    function braces(s,    t, opens, closes) {
        t = s; opens = gsub(/\{/, "", t)
        t = s; closes = gsub(/\}/, "", t)
        return opens - closes
    }
    FNR == 1 { in_comment = 0; in_pp = 0; state = 0; reset_head() }
    {
        raw = $0
        was_comment = in_comment
        line = strip(raw)
        if (in_pp) { in_pp = (raw ~ /\\$/); next }
        if (state == 2) {                       # inside a body: ends at the first "}" at column 0
            if (!was_comment && raw ~ /^}/) {
                print FILENAME "\t" start "\t" name "\t" (FNR - start + 1)
                state = 0
            }
            next
        }
        if (state == 3) {                       # inside a non-function block: ends where its braces do
            depth += braces(line)
            if (depth <= 0) state = 0
            next
        }
        if (state == 0) {
            if (was_comment || raw !~ /^[A-Za-z_]/) {
                if (!was_comment && raw ~ /^[ \t]*#/) in_pp = (raw ~ /\\$/)
                next
            }
            if (raw ~ /^[A-Za-z_][A-Za-z0-9_]*:/ && raw !~ /::/) next     # a label
            state = 1; head = ""; head_line = FNR
        }
        # state 1: collecting a head that started at column 0
        if (!was_comment && raw ~ /^[ \t]*#/) { in_pp = (raw ~ /\\$/); next }
        b = index(line, "{")
        if (b == 0) {
            if (line ~ /;[ \t]*$/) { state = 0; reset_head(); next }   # declaration or prototype
            head = head " " line
            next
        }
        head = head " " substr(line, 1, b - 1)
        name = func_name(head)
        start = head_line
        if (name == "") {
            depth = braces(substr(line, b))
            state = depth > 0 ? 3 : 0
            reset_head()
            next
        }
        if (braces(substr(line, b)) <= 0) {     # the whole body on this line
            print FILENAME "\t" start "\t" name "\t" (FNR - start + 1)
            state = 0
        } else state = 2
        reset_head()
    }
    END { }
    ' "$@"
}

table=$(measure "${files[@]}")

status=0
if command -v ctags >/dev/null 2>&1 && ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
    ours=$(awk -F'\t' '{print $1 "\t" $3}' <<<"$table" | LC_ALL=C sort)
    # (the line number keeps ctags from merging the two definitions of a name in #if/#else branches)
    theirs=$(ctags -x --_xformat='%F	%N	%n' --kinds-C=f --language-force=C "${files[@]}" 2>/dev/null | cut -f1,2 | LC_ALL=C sort)
    missed=$(LC_ALL=C comm -13 <(printf '%s\n' "$ours") <(printf '%s\n' "$theirs") | sed '/^$/d')
    extra=$(LC_ALL=C comm -23 <(printf '%s\n' "$ours") <(printf '%s\n' "$theirs") | sed '/^$/d')
    if [ -n "$missed$extra" ]; then
        [ -z "$missed" ] || sed 's/\t/: ctags finds function /; s/$/, this check does not/' <<<"$missed" >&2
        [ -z "$extra" ] || sed 's/\t/: this check finds function /; s/$/, ctags does not/' <<<"$extra" >&2
        echo "check_func_length: the column-0 heuristic disagrees with ctags (see above; house style: docs/design.md)" >&2
        status=2
    fi
fi

if [ "$list" = 1 ]; then
    sort -t$'\t' -k4,4nr -k1,1 -k2,2n <<<"$table" | awk -F'\t' '{print $1 ":" $2 ": " $3 " " $4}'
fi
if [ "$warn" -gt 0 ]; then
    sort -t$'\t' -k4,4nr -k1,1 -k2,2n <<<"$table" |
        awk -F'\t' -v w="$warn" -v l="$limit" '$4 > w && $4 <= l {print $1 ":" $2 ": " $3 " is " $4 " lines (over " w ", within the limit " l ")"}'
fi

over=$(sort -t$'\t' -k4,4nr -k1,1 -k2,2n <<<"$table" |
    awk -F'\t' -v l="$limit" -v allow="$allow" '
        BEGIN { while ((getline a < allow) > 0) { sub(/#.*/, "", a); gsub(/[ \t]/, "", a); if (a != "") allowed[a] = 1 } }
        $4 > l { key = $1 ":" $3
                 if (key in allowed) print "A\t" $1 ":" $2 ": " $3 " is " $4 " lines (limit " l "), allowed for now"
                 else print "F\t" $1 ":" $2 ": " $3 " is " $4 " lines (limit " l ")" }')
n=$(wc -l <<<"$table")
nfail=0
nallowed=0
while IFS=$'\t' read -r kind msg; do
    [ -n "$kind" ] || continue
    if [ "$kind" = F ]; then echo "$msg" >&2; nfail=$((nfail + 1)); else echo "$msg"; nallowed=$((nallowed + 1)); fi
done <<<"$over"
if [ "$nfail" -gt 0 ]; then
    echo "check_func_length: $nfail of $n functions over $limit lines (see above; split them into named helpers)" >&2
    [ "$status" = 2 ] || status=1
elif [ "$status" = 0 ]; then
    echo "check_func_length: ok ($n functions, none over $limit lines$([ "$nallowed" = 0 ] || echo " but $nallowed allowed for now"))"
fi
exit "$status"
