#include "cluster/hostlist.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Hosts = std::vector<std::string>;

// The message of the Error that `list` raises when expanded.
std::string hostlist_error(const std::string& list) {
  try {
    expand_hostlist(list);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expand_hostlist('" << list << "') did not throw";
  return "";
}

TEST(Hostlist, SingleHosts) {
  EXPECT_THAT(expand_hostlist("node1"), ElementsAre("node1"));
  EXPECT_THAT(expand_hostlist("a,b,c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(expand_hostlist("gpu-node.example.org"), ElementsAre("gpu-node.example.org"));
}

TEST(Hostlist, RangesKeepZeroPadding) {
  EXPECT_EQ(expand_hostlist("n[01-04,7]"), (Hosts{"n01", "n02", "n03", "n04", "n7"}));
  EXPECT_EQ(expand_hostlist("n[8-10]"), (Hosts{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_hostlist("n[08-10]"), (Hosts{"n08", "n09", "n10"}));
  EXPECT_EQ(expand_hostlist("n[007]"), (Hosts{"n007"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
}

TEST(Hostlist, BracketsAnywhereInTheName) {
  EXPECT_EQ(expand_hostlist("gpu-a[1-2]-ib,cpu1"), (Hosts{"gpu-a1-ib", "gpu-a2-ib", "cpu1"}));
  EXPECT_EQ(expand_hostlist("[1-2]n"), (Hosts{"1n", "2n"}));
  EXPECT_EQ(expand_hostlist("[3,5]"), (Hosts{"3", "5"}));
}

TEST(Hostlist, SeveralGroupsExpandFirstGroupOutermost) {
  EXPECT_EQ(expand_hostlist("r[1-2]n[1-2]"), (Hosts{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_hostlist("r[1-2]n[01,3]-x"), (Hosts{"r1n01-x", "r1n3-x", "r2n01-x", "r2n3-x"}));
  EXPECT_EQ(expand_hostlist("a[1-2]b[1]c[5-6]"), (Hosts{"a1b1c5", "a1b1c6", "a2b1c5", "a2b1c6"}));
}

TEST(Hostlist, CommasInsideBracketsAndBetweenHosts) {
  EXPECT_EQ(expand_hostlist("n[1,3-4],m[2],x"), (Hosts{"n1", "n3", "n4", "m2", "x"}));
  EXPECT_EQ(expand_hostlist("n[1-2],n[1-2]"), (Hosts{"n1", "n2", "n1", "n2"}));
}

TEST(Hostlist, FirstHost) {
  EXPECT_EQ(first_host("n[01-04]"), "n01");
  EXPECT_EQ(first_host("gpu-a[3-4]-ib,cpu1"), "gpu-a3-ib");
  EXPECT_EQ(first_host("r[2-3]n[07-9]"), "r2n07");
  EXPECT_EQ(first_host("login"), "login");
  // The whole list is validated, not just the first host.
  EXPECT_THROW(first_host("n1,m[2-"), Error);
}

TEST(Hostlist, FirstHostDoesNotExpandHugeLists) {
  EXPECT_EQ(first_host("a[0-999999]b[0-999999]"), "a0b0");
  EXPECT_THAT(hostlist_error("a[0-999999]b[0-999999]"), HasSubstr("more than"));
}

TEST(Hostlist, MalformedListsNameTheListAndThePosition) {
  EXPECT_THAT(hostlist_error("n[1-"),
              AllOf(HasSubstr("'n[1-'"), HasSubstr("never closed"), HasSubstr("position 1")));
  EXPECT_THAT(hostlist_error("n[3-1]"),
              AllOf(HasSubstr("'n[3-1]'"), HasSubstr("3-1 goes down"), HasSubstr("position 2")));
  EXPECT_THAT(hostlist_error("n[a-b]"),
              AllOf(HasSubstr("expected a number, found 'a'"), HasSubstr("position 2")));
  EXPECT_THAT(hostlist_error("n]"),
              AllOf(HasSubstr("without a matching '['"), HasSubstr("position 1")));
  EXPECT_THAT(hostlist_error(""), HasSubstr("empty"));
  EXPECT_THAT(hostlist_error("n[]"), AllOf(HasSubstr("empty brackets"), HasSubstr("position 1")));
  EXPECT_THAT(hostlist_error("n[1,,2]"), AllOf(HasSubstr("empty range"), HasSubstr("position 4")));
}

TEST(Hostlist, OtherMalformedLists) {
  EXPECT_THAT(hostlist_error("n["), HasSubstr("never closed"));
  EXPECT_THAT(hostlist_error("n[1"), HasSubstr("never closed"));
  EXPECT_THAT(hostlist_error("n[1,]"), HasSubstr("empty range"));
  EXPECT_THAT(hostlist_error("n[1-2-3]"), HasSubstr("expected ',' or ']'"));
  EXPECT_THAT(hostlist_error("n[[1]]"), HasSubstr("expected a number, found '['"));
  EXPECT_THAT(hostlist_error("n[1-]"), HasSubstr("expected a number, found ']'"));
  EXPECT_THAT(hostlist_error("n1,,n2"),
              AllOf(HasSubstr("empty host name"), HasSubstr("position 3")));
  EXPECT_THAT(hostlist_error("n1,"), HasSubstr("empty host name"));
  EXPECT_THAT(hostlist_error(",n1"), HasSubstr("empty host name"));
  EXPECT_THAT(hostlist_error("n1 n2"), HasSubstr("whitespace"));
  EXPECT_THAT(hostlist_error("n[1-9999999999999999999]"), HasSubstr("too many digits"));
  EXPECT_THAT(hostlist_error("n[0-99999999]"), HasSubstr("too large"));
}

TEST(TasksPerNode, ExpandsRepetitions) {
  EXPECT_THAT(expand_tasks_per_node("4"), ElementsAre(4));
  EXPECT_THAT(expand_tasks_per_node("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(expand_tasks_per_node("1,3(x2),2"), ElementsAre(1, 3, 3, 2));
  EXPECT_THAT(expand_tasks_per_node("0(x1)"), ElementsAre(0));
}

TEST(TasksPerNode, MalformedSpecsNameTheSpec) {
  for (const std::string spec : {"", "2(x3", "2(3)", "2(x0)", "a", "2,", "2;1", "2(x)"}) {
    try {
      expand_tasks_per_node(spec);
      ADD_FAILURE() << "no error for '" << spec << "'";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(),
                  AllOf(HasSubstr("tasks per node '" + spec + "'"), HasSubstr("position")));
    }
  }
}

}  // namespace
}  // namespace dtrain::cluster
