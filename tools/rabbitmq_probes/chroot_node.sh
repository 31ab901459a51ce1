#!/bin/bash
# Start a RabbitMQ node from a debootstrap chroot (see docs/production.md): its own mount namespace
# (proc), epmd port, node name, data and config; foreground in the background, as 4.3 needs.
# Usage: chroot_node.sh CHROOT NAME PORT EPMD_PORT [rabbitmq.conf lines...]; rabbitmqctl: chroot_ctl.sh CHROOT NAME args
CH=$1; NAME=$2; PORT=$3; EPMD=$4; shift 4
D=/probe/$NAME
mkdir -p $CH$D/home $CH$D/mnesia $CH$D/log
: > $CH$D/enabled_plugins; echo "[{rabbit, [{channel_tick_interval, 500}]}]." > $CH$D/advanced.config
{ echo "listeners.tcp.default = 127.0.0.1:$PORT"; for l in "$@"; do echo "$l"; done; } > $CH$D/rabbitmq.conf
[ -f $CH$D/home/.erlang.cookie ] || { echo -n "probecookie$NAME" > $CH$D/home/.erlang.cookie; chmod 400 $CH$D/home/.erlang.cookie; }
cat > $CH$D/env.sh <<EOT
export HOME=$D/home ERL_EPMD_PORT=$EPMD RABBITMQ_NODENAME=$NAME@localhost RABBITMQ_NODE_PORT=$PORT RABBITMQ_DIST_PORT=$((PORT+20000)) RABBITMQ_MNESIA_BASE=$D/mnesia RABBITMQ_LOG_BASE=$D/log RABBITMQ_ENABLED_PLUGINS_FILE=$D/enabled_plugins RABBITMQ_CONFIG_FILE=$D/rabbitmq.conf RABBITMQ_PID_FILE=$D/node.pid RABBITMQ_ADVANCED_CONFIG_FILE=$D/advanced.config
EOT
setsid unshare -m chroot $CH /bin/sh -c "mount -t proc proc /proc; . $D/env.sh; exec /usr/lib/rabbitmq/bin/rabbitmq-server" > $CH$D/out.log 2>&1 < /dev/null &
echo $! > /tmp/$NAME.launcher.pid
