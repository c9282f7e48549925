"""NVML access shared by the backends and attribution: the call gate (:mod:`.calls`), the reference-counted
session with the device handles and MIG layouts (:mod:`.session`), and MIG enumeration (:mod:`.mig`)."""
