"""Several engine replicas behind one gRPC front end, on Ray Serve
(``quickdraft serve --replicas N``; docs/scaling.md).

- routing.py: the routing policy (session affinity, load-aware spill-over), plain Python;
- router.py: that policy as Ray Serve's RequestRouter;
- replica.py: one replica, the single-process server's stack with no listener;
- ingress.py: the front end (RoutedService, ReplicaServer).

Ray is an optional extra (``pip install -e .[replicas]``); only router.py and
ingress.py import it, and only when replicas run.
"""
