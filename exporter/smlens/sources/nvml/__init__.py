"""NVML access and the NVML-based backends: the call gate (:mod:`.calls`), the reference-counted session with
the device handles and MIG layouts (:mod:`.session`), MIG enumeration (:mod:`.mig`), the NVML backend
(:mod:`.backend`), GPM (:mod:`.gpm`) and the XID watch (:mod:`.xids`)."""
