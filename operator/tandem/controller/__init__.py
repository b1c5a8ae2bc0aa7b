"""The operator shell: kopf watches, a keyed work queue, leader election and one reconcile pass."""
