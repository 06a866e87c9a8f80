"""The Firestore side: the handler's job, its claim, fence, lease, records, outbox, failure path."""
