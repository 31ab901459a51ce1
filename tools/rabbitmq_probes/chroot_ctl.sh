#!/bin/bash
# rabbitmqctl for a node started by chroot_node.sh. Usage: chroot_ctl.sh CHROOT NAME args...
CH=$1; NAME=$2; shift 2
unshare -m chroot $CH /bin/sh -c "mount -t proc proc /proc; . /probe/$NAME/env.sh; exec /usr/lib/rabbitmq/bin/rabbitmqctl -n $NAME@localhost \"\$@\"" ctl "$@"
