"""Two "hosts" on this machine for the benchmarks that need them (root):
network namespaces <tag>h0 and <tag>h1 (10.232.0.1 and 10.232.0.2 on eth0),
joined by veth pairs on a bridge in a third namespace <tag>sw, as
bench/compare_multihost.sh makes them. close() kills what runs in them and
removes them."""
import os
import subprocess


class NamespaceHosts:
    def __init__(self, tag):
        self.tag = tag
        self.nss = []
        sw = tag + "sw"
        self._ns(sw)
        self._ip("-n", sw, "link", "add", "br0", "type", "bridge")
        self._ip("-n", sw, "link", "set", "br0", "up")
        for i in (0, 1):
            h = self.host(i)
            self._ns(h)
            self._ip("-n", sw, "link", "add", "p%d" % i, "type", "veth", "peer", "name", "eth0", "netns", h)
            self._ip("-n", sw, "link", "set", "p%d" % i, "master", "br0", "up")
            self._ip("-n", h, "link", "set", "lo", "up")
            self._ip("-n", h, "addr", "add", "10.232.0.%d/24" % (i + 1), "dev", "eth0")
            self._ip("-n", h, "link", "set", "eth0", "up")

    def host(self, i):
        """The namespace of host i."""
        return "%sh%d" % (self.tag, i)

    def _ns(self, name):
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.nss.append(name)

    @staticmethod
    def _ip(*args):
        subprocess.run(["ip"] + list(args), check=True)

    def rate(self, rate):
        """Each host's link (egress, each way) limited to `rate` by tc tbf."""
        for i in (0, 1):
            subprocess.run(["tc", "-n", self.host(i), "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                            "burst", "1mb", "latency", "200ms"], check=True)

    def in_host(self, i, argv, shm_size):
        """argv run in host i: its namespace, hostname host<i>, a /dev/shm of its own of shm_size."""
        script = 'hostname host%d; mount -t tmpfs -o size=%s tmpfs /dev/shm; exec "$@"' % (i, shm_size)
        return ["ip", "netns", "exec", self.host(i), "unshare", "--uts", "--ipc", "--mount", "--propagation",
                "private", "bash", "-c", script, "_"] + list(argv)

    def close(self):
        for n in self.nss:
            pids = subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()
            for q in pids:
                try:
                    os.kill(int(q), 9)
                except (OSError, ValueError):
                    pass
        for n in self.nss:
            subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)
