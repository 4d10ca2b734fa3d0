//! Who may call what: three roles, each allowed what the one below it is, and the role
//! each admin call needs. One table for the gRPC API, `sluicectl` and the console alike,
//! so none of them can allow what another refuses.

use std::fmt;
use std::str::FromStr;

/// A user's role. Ordered: each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads: the cluster, sources, pipelines, builds, checks, events, dead letters.
    Viewer,
    /// Runs the work: builds, swaps, rollbacks, checks and repairs, delayed jobs,
    /// replays, rebalances, the dictionary.
    Operator,
    /// Changes what is synchronised and who may: sources, pipelines, deletes, users.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not a role: viewer, operator or admin"))
    }
}

/// What a call of the admin service needs, by its method name (`PutSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub role: Role,
    /// Whether it changes anything (and so is recorded in the audit log).
    pub mutating: bool,
}

/// What `method` needs; `None` for a method this table does not know, which is refused
/// (a call added to the API without a role here cannot be made).
pub fn need(method: &str) -> Option<Need> {
    use Role::*;
    let (role, mutating) = match method {
        "GetLeader" | "ListSources" | "ListPipelines" | "GetBuild" | "ListChecks" | "GetCheck"
        | "ListDelayed" | "ListWorkers" | "ListTasks" | "ListEvents" | "ListDeadLetters"
        | "ListWords" | "WhoAmI" | "ExplainDocument" | "ListTables" => (Viewer, false),
        // Every user manages their own tokens (an admin's call may name another user).
        "ListTokens" => (Viewer, false),
        "CreateToken" | "RevokeToken" => (Viewer, true),
        // The console's login and logout (not admin calls): recorded.
        "Login" | "Logout" => (Viewer, true),
        "ListAudit" => (Operator, false),
        "BuildPipeline" | "StartCompare" | "SwapPipeline" | "ResetPipeline"
        | "RollbackPipeline" | "StartCheck" | "ApplyDelayed" | "ResyncDocuments" | "Rebalance"
        | "ReplayDeadLetters" | "AddWords" | "EditWord" | "PublishWords" | "DeleteWords" => {
            (Operator, true)
        }
        "PutSource" | "DeleteSource" | "FailoverSource" | "ResnapshotSource" | "PutPipeline"
        | "DeletePipeline" | "DropVersion" | "PutUser" | "DeleteUser" => (Admin, true),
        "ListUsers" | "TestSource" | "PreviewPipeline" => (Admin, false),
        _ => return None,
    };
    Some(Need { role, mutating })
}

/// Whether a caller holding `role` may call `method`: `Err` says why not, naming the role
/// it needs.
pub fn allows(role: Role, method: &str) -> Result<Need, String> {
    let Some(need) = need(method) else {
        return Err(format!("{method}: no role may call it"));
    };
    if role >= need.role {
        Ok(need)
    } else {
        Err(format!(
            "{method} needs the {} role; this caller's role is {role}",
            need.role
        ))
    }
}

/// The admin service's methods, in the order its definition gives them.
#[cfg(test)]
pub(crate) fn admin_methods() -> Vec<&'static str> {
    let proto = include_str!("../../../proto/sluice/v1/admin.proto");
    let admin = proto
        .split("service Admin {")
        .nth(1)
        .and_then(|s| s.split("\n}").next())
        .expect("the Admin service");
    admin
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rpc "))
        .map(|l| l.split('(').next().unwrap_or_default().trim())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn methods() -> Vec<&'static str> {
        admin_methods()
    }

    #[test]
    fn every_admin_method_has_a_role_and_nothing_else_does() {
        let methods = methods();
        assert!(methods.len() > 30, "{methods:?}");
        let missing: Vec<_> = methods.iter().filter(|m| need(m).is_none()).collect();
        assert!(missing.is_empty(), "methods without a role: {missing:?}");
        assert_eq!(
            need("Report"),
            None,
            "the workers' reports are not an admin call"
        );
        assert_eq!(need("Nonesuch"), None);
    }

    #[test]
    fn each_role_may_do_what_the_roles_below_it_may() {
        assert!(allows(Role::Viewer, "ListSources").is_ok());
        assert!(allows(Role::Viewer, "BuildPipeline").is_err());
        assert!(allows(Role::Operator, "BuildPipeline").is_ok());
        assert!(allows(Role::Operator, "ListAudit").is_ok());
        let refused = allows(Role::Operator, "PutSource").unwrap_err();
        assert_eq!(
            refused,
            "PutSource needs the admin role; this caller's role is operator"
        );
        for m in methods() {
            let needed = need(m).unwrap().role;
            for r in Role::ALL {
                assert_eq!(allows(r, m).is_ok(), r >= needed, "{r} calling {m}");
            }
        }
    }

    #[test]
    fn reads_are_not_audited_and_changes_are() {
        assert!(!need("ListPipelines").unwrap().mutating);
        assert!(need("DeletePipeline").unwrap().mutating);
        assert!(need("ReplayDeadLetters").unwrap().mutating);
        for m in methods() {
            let n = need(m).unwrap();
            let reads = m.starts_with("List")
                || m.starts_with("Get")
                || m == "WhoAmI"
                || m == "ExplainDocument"
                || m == "TestSource"
                || m == "PreviewPipeline";
            assert_eq!(n.mutating, !reads, "{m}");
        }
    }

    #[test]
    fn roles_read_as_they_print() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert!("root"
            .parse::<Role>()
            .unwrap_err()
            .contains("viewer, operator or admin"));
    }
}
