#!/bin/sh
# A test KMS for cove's "command" key provider (docs/security.md, "command provider
# protocol"): `kms.sh wrap|unwrap DIR` reads one base64 line on stdin and prints one base64
# line. The KEK is the passphrase in DIR/kek (AES-256-CBC + PBKDF2 via openssl). Switches:
# DIR/revoked → exit 3 (the KMS refuses), DIR/hang → never answers, DIR/garbage → prints
# something that is not base64. Every call appends its operation to DIR/calls.
op=$1
dir=$2
echo "$op" >> "$dir/calls"
[ -e "$dir/revoked" ] && exit 3
[ -e "$dir/hang" ] && exec sleep 3600
if [ -e "$dir/garbage" ]; then
        echo 'this is not base64 !'
        exit 0
fi
case "$op" in
wrap) base64 -d | openssl enc -aes-256-cbc -pbkdf2 -iter 1000 -salt -pass "file:$dir/kek" | base64 -w0 ;;
unwrap) base64 -d | openssl enc -d -aes-256-cbc -pbkdf2 -iter 1000 -pass "file:$dir/kek" | base64 -w0 ;;
*) exit 2 ;;
esac
status=$?
echo
exit $status
