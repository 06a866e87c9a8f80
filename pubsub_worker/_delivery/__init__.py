"""The Pub/Sub side: delivery generations, the key gates and the Pub/Sub lease (internal)."""
