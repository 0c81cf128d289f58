now() { date +%s.%N | cut -c1-14; }
stamp() { while IFS= read -r l; do echo "$(now) $l"; done; }
MSCCLPP_DEVICE_TIMEOUT=4 "$1" --nranks 2 -b 64K -e 64K -n 200000000 -w 1 > >(stamp) 2>&1 &
pid=$!
sleep 6
kid=""
for k in $(pgrep -P $pid); do grep -qz '^MSCCLPP_RANK=1$' /proc/$k/environ 2>/dev/null && kid=$k; done
echo "$(now) SIGSTOP to rank 1: $kid"
kill -STOP "$kid"
wait $pid; rc=$?; echo "$(now) launcher exit $rc"
