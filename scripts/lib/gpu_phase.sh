# shellcheck shell=bash
# The phase runner of scripts/gpu_check.sh: one command under `timeout`,
# its output timestamped into GROUP_DIR/NAME.log, a watchdog that records
# what the machine is doing when the log goes quiet, and one line per phase
# in GROUP_DIR/phases.tsv (group, phase, status, exit code, seconds, note).
#
# The caller sets: GROUP (the group's name), GROUP_DIR (absolute), WATCHDOG_S
# (seconds without a new log line before a report), BUDGET_END (epoch
# seconds by which the group must be done), MIN_PHASE_S (a phase with
# less time left is skipped) and PHASES (empty, or an extended regular
# expression: a phase whose whole name it does not match is skipped).

# Prefixes every line of stdin with the wall time (bash's own clock: no
# process per line).
stamp() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%(%H:%M:%S)T %s\n' -1 "$line"
    done
}

# Appends one phase line to phases.tsv.
record() { # NAME STATUS RC SECONDS NOTE
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$GROUP" "$1" "$2" "$3" "$4" "$5" >>"$GROUP_DIR/phases.tsv"
}

# Whether PHASES (empty: every phase) names phase $1.
selected() { # NAME
    [ -z "${PHASES:-}" ] || [[ $1 =~ ^(${PHASES})$ ]]
}

# A phase that does not run here, with the reason.
skip_phase() { # NAME REASON
    echo "######## $1 skipped: $2"
    record "$1" skipped - 0 "$2"
}

# The pids below pid $1 (children, grandchildren, ...), from /proc.
descendants() {
    local -A kids=()
    local stat line pid fields queue=("$1") p
    for stat in /proc/[0-9]*/stat; do
        # (A process may end between the glob and the read.)
        { read -r line <"$stat"; } 2>/dev/null || continue
        pid=${line%% *}
        # Fields after the command name, which may hold spaces and ')'.
        read -r -a fields <<<"${line##*) }"
        kids[${fields[1]}]+=" $pid"
    done
    while [ ${#queue[@]} -gt 0 ]; do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        for pid in ${kids[$p]:-}; do
            echo "$pid"
            queue+=("$pid")
        done
    done
}

# TICKS clock ticks at HZ a second, as seconds with two decimals.
seconds() { # TICKS HZ
    local cs=$(($1 * 100 / $2))
    printf '%d.%02d' $((cs / 100)) $((cs % 100))
}

# CPU ticks of each thread at the last report, to print what each used since.
declare -A LAST_TICKS=()

# The state of every thread of every process below pid $1 but the shells,
# `timeout` and `sleep`: state (R running, S sleeping, D in the kernel),
# CPU seconds so far and since the last report. A thread busy on the CPU
# while the GPU idles is compiling (NVRTC) or autotuning on the host.
thread_report() {
    local pid comm task line fields tid name ticks hz
    hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
    for pid in $(descendants "$1"); do
        comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
        case "$comm" in bash | timeout | sleep | cat | stat | getconf) continue ;; esac
        echo "  process $pid $comm:"
        for task in /proc/"$pid"/task/*; do
            { read -r line <"$task/stat"; } 2>/dev/null || continue
            tid=${line%% *}
            name=${line#*(}
            name=${name%)*}
            read -r -a fields <<<"${line##*) }"
            ticks=$((fields[11] + fields[12]))
            printf '    thread %s %-16s %s cpu %s s (+%s s)\n' "$tid" "$name" "${fields[0]}" \
                "$(seconds "$ticks" "$hz")" "$(seconds $((ticks - ${LAST_TICKS[$tid]:-0})) "$hz")"
            LAST_TICKS[$tid]=$ticks
        done
    done
}

# What the GPU is doing, when nvidia-smi is on the machine.
gpu_report() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,clocks.sm \
            --format=csv 2>&1 | sed 's/^/  gpu: /'
    else
        echo "  gpu: nvidia-smi is not on this machine"
    fi
}

# run_phase NAME LIMIT_S COMMAND...: runs COMMAND under `timeout` (at most
# LIMIT_S, less when the group's budget ends sooner). Every WATCHDOG_S
# seconds without a new line in the log, appends a report (GPU use, thread
# states) to it. Returns 0 whatever the command's exit status: the status
# goes to phases.tsv and the summary.
run_phase() {
    local name=$1 limit=$2
    shift 2
    local log="$GROUP_DIR/$name.log" rcfile="$GROUP_DIR/.$name.rc"
    if ! selected "$name"; then
        skip_phase "$name" "not in PHASES"
        return 0
    fi
    local left=$((BUDGET_END - EPOCHSECONDS - 15))
    if [ "$left" -lt "$limit" ]; then
        if [ "$left" -lt "$MIN_PHASE_S" ]; then
            skip_phase "$name" "the group's time budget is spent (${left}s left)"
            return 0
        fi
        limit=$left
    fi
    echo "######## $name $(date +%T) (timeout ${limit}s)"
    printf '%(%H:%M:%S)T ######## %s: timeout %ss: %s\n' -1 "$name" "$limit" "$*" >>"$log"
    rm -f "$rcfile"
    local start=$EPOCHSECONDS
    (
        timeout -k 10 "$limit" "$@" 2>&1
        echo $? >"$rcfile"
    ) 2>&1 | stamp >>"$log" &
    local pipe=$! size seen=-1 quiet_since=$start reports=0
    while kill -0 "$pipe" 2>/dev/null; do
        sleep 1
        size=$(stat -c %s "$log")
        if [ "$size" != "$seen" ]; then
            seen=$size
            quiet_since=$EPOCHSECONDS
        elif [ $((EPOCHSECONDS - quiet_since)) -ge "$WATCHDOG_S" ]; then
            reports=$((reports + 1))
            echo "watchdog: $name has printed nothing for $((EPOCHSECONDS - quiet_since))s (report $reports in $name.log)"
            {
                printf '%(%H:%M:%S)T watchdog: no new line for %ss\n' -1 "$((EPOCHSECONDS - quiet_since))"
                gpu_report
                thread_report "$BASHPID"
            } >>"$log" 2>&1
            seen=$(stat -c %s "$log")
            quiet_since=$EPOCHSECONDS
        fi
        if [ $((EPOCHSECONDS - start)) -gt $((limit + 30)) ]; then
            # Something outlived `timeout` and holds the output pipe.
            # shellcheck disable=SC2046 # one pid a word
            kill -KILL $(descendants "$BASHPID") 2>/dev/null
        fi
    done
    wait "$pipe"
    local rc seconds=$((EPOCHSECONDS - start)) status note=""
    rc=$(cat "$rcfile" 2>/dev/null || echo killed)
    rm -f "$rcfile"
    case "$rc" in
    0) status=ok ;;
    124 | 137) status=timeout note="stopped after ${limit}s" ;;
    *) status=failed note="exit $rc" ;;
    esac
    [ "$reports" -gt 0 ] && note="${note:+$note; }$reports watchdog report(s)"
    printf '%(%H:%M:%S)T ######## %s: %s after %ss %s\n' -1 "$name" "$status" "$seconds" "$note" >>"$log"
    echo "######## $name: $status after ${seconds}s ${note}"
    grep -E '^[0-9:]{8} ' "$log" | grep -v -e '^.\{8\} ######## ' -e '^.\{8\} watchdog: ' |
        tail -n 2 | sed 's/^/  | /'
    record "$name" "$status" "$rc" "$seconds" "$note"
}
